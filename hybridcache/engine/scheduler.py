"""Who runs this step. Default policy, maximum utilisation: admit while there is room now; when a
generating request cannot grow, preempt (the preemption policy picks the victim and swap or re-prefill);
resume suspended requests first when room returns. The `reserve` policy admits a request only when the
pages of its whole length (prompt + max_tokens) are free beside what the running requests may still grow
into, so growth never preempts. The device split between slots and pages follows demand (`DemandSplit`).

Each decision is one `planner.allocate(...)` call: it allocates, or returns False having changed nothing.
The scheduler never touches a tensor; the request's lifecycle status is the planner's.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Hashable, Sequence

from ..cache import BudgetTooSmallError, HostTierFullError, HybridCacheManager, Status
from .errors import SchedulerStuckError
from .policy import DemandSplit, PreemptionPolicy
from .request import Request

POLICIES = ("max_utilization", "reserve")
log = logging.getLogger(__name__)


@dataclass
class ScheduledStep:
    context: list[tuple[Request, int]] = field(default_factory=list)  # (request, chunk tokens)
    generation: list[Request] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.context and not self.generation


class Scheduler:
    def __init__(
        self, manager: HybridCacheManager, max_num_seqs: int, max_num_batched_tokens: int, verify_tokens: int,
        policy: str = "max_utilization", preemption: PreemptionPolicy | None = None,
        split: DemandSplit | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {policy!r}; choose from {POLICIES}")
        self.policy = policy
        self.manager = manager
        self.planner = manager.planner
        self.max_num_seqs = max_num_seqs
        self.token_budget = max_num_batched_tokens
        self.verify_tokens = verify_tokens  # tokens a generation row feeds: the last sampled one + drafts
        self.preemption = preemption or PreemptionPolicy()
        self.split = split
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # CONTEXT or GENERATION, holding device state
        self.suspended: list[Request] = []
        self._last_chunk = 0  # set by `_chunk`: the tokens of the context chunk last tried

    # ------------------------------------------------------------------ queues
    def add(self, req: Request) -> None:
        self.planner.add(req.req_id)
        _insert_sorted(self.waiting, req)

    def finish(self, req: Request) -> None:
        """The request is done: the cache forgets it."""
        self._remove(req)
        self.planner.free(req.req_id)

    def restart(self, req_ids: Sequence[Hashable], requests: dict[Hashable, Request]) -> None:
        """The cache dropped these requests' state (a failed step): they start again from their tokens."""
        for rid in req_ids:
            req = requests[rid]
            self._remove(req)
            req.num_prefilled = 0
            _insert_sorted(self.waiting, req)

    def status(self, req: Request) -> Status:
        return self.planner.status(req.req_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.suspended)

    def known(self) -> list[Request]:
        return self.running + self.suspended + self.waiting

    # ------------------------------------------------------------------ one step
    def schedule(self) -> ScheduledStep:
        self._resume_suspended()
        step = self._rows()
        while step.empty and self.running:
            # everyone is stuck (prefills holding pages): free room by preempting a victim
            self._preempt(self.preemption.victim(self.running))
            self._resume_suspended()
            step = self._rows()
        while step.empty and not self.running and self._drop_kept_pages():
            self._resume_suspended()
            step = self._rows()
        if step.empty and self.has_work:
            raise SchedulerStuckError(
                f"no request can run: {len(self.waiting)} waiting and {len(self.suspended)} suspended do not fit "
                f"{self.planner.num_slots} slots and {self.planner.num_pages} pages"
            )
        return step

    def rebalance(self, num_slots: int) -> int:
        """Re-split the device cache into `num_slots` slots and the pages that fit beside them, first
        preempting victims until the live requests fit. Refused (BudgetTooSmallError, nothing changed) when the
        split cannot hold the longest request known. Returns the bytes moved."""
        mgr = self.manager
        if not mgr.can_split(num_slots, self._longest_pages()):
            raise BudgetTooSmallError(
                f"{num_slots} slots do not fit the device budget of {mgr.config.device_bytes} bytes with room "
                f"for the longest request ({self._longest_pages()} pages)"
            )
        while self.running and not mgr.can_rebalance(num_slots):
            self._preempt(self.preemption.victim(self.running))
        return mgr.rebalance(num_slots)

    # ------------------------------------------------------------------ internals
    def _resume_suspended(self) -> None:
        while self.suspended and len(self.running) < self.max_num_seqs:
            req = self.suspended[0]
            try:  # with room for its next step too: a resume that cannot step is suspended again at once
                self.manager.resume([req.req_id], then_pages=self._growth_after_resume(req))
            except MemoryError:
                if self._shrink(wants_slot=True):
                    continue
                return
            self.suspended.pop(0)
            _insert_sorted(self.running, req)

    def _growth_after_resume(self, req: Request) -> int:
        """Pages a suspended request takes for its next step beyond those it keeps and those it brings back."""
        back = len(self.planner.entry(req.req_id).host_pages)
        return max(0, self.planner.pages_needed(req.req_id, self.verify_tokens) - back)

    def _rows(self) -> ScheduledStep:
        """Generation rows, then context rows in the token budget left."""
        generation = self._generation_rows()
        return ScheduledStep(context=self._context_rows(generation), generation=generation)

    def _generation_rows(self) -> list[Request]:
        while True:
            gen = [r for r in self.running if self.status(r) == Status.GENERATION]
            if not gen or self.manager.allocate([r.req_id for r in gen], self.verify_tokens):
                return gen
            if not self._shrink(wants_slot=False):
                self._preempt(self.preemption.victim(self.running))

    def _context_rows(self, generation: list[Request]) -> list[tuple[Request, int]]:
        budget = self.token_budget - self.verify_tokens * len(generation)
        rows: list[tuple[Request, int]] = []
        candidates = [r for r in self.running if self.status(r) == Status.CONTEXT] + list(self.waiting)
        reserved = self._pages_still_needed(self.running) if self.policy == "reserve" else 0
        for i, req in enumerate(candidates):
            waiting = self.status(req) == Status.WAITING
            if budget <= 0 or (waiting and len(self.running) >= self.max_num_seqs):
                self._look_ahead(rows, candidates[i:])
                break
            match = self._match(req) if waiting else None
            if match is not None and match.defer:  # an in-flight request will save the prefix it needs
                budget += _stop_at(rows, match.leader, match.branch)
                continue
            if waiting and self.policy == "reserve":
                whole = self._pages_still_needed([req])
                if reserved + whole > self.planner.page_pool.num_free:
                    break
                reserved += whole
            chunk = self._chunk(req, match, budget)
            # a re-split keeps every allocation made so far; this chunk is tried once more on the new split
            # (after a fresh match: a re-split may drop cached snapshots)
            if not self.manager.allocate([req.req_id], chunk, prefix=match) and not (
                self._resplit_for(req, waiting) and self._allocate_again(req, match, budget)
            ):
                break
            chunk = self._last_chunk  # the chunk of the allocation that went through
            if waiting:
                req.num_prefilled = self.planner.entry(req.req_id).num_tokens  # the cached prefix, if any
            rows.append((req, chunk))
            budget -= chunk
            if waiting:
                self.waiting.remove(req)
                _insert_sorted(self.running, req)
        return rows

    def _look_ahead(self, rows: list[tuple[Request, int]], waiting: list[Request]) -> None:
        """No seat or token is left: still match the next waiting requests (up to `max_num_seqs`), so that an
        in-flight request of their group is asked to save at their branch point (its chunk in this step
        is cut there) before it prefills past it. With no request prefilling (nothing in flight) a match could
        neither defer nor ask anyone to save, so none is made (a decode-only step costs no matching)."""
        if self.planner.prefix is None or not self.planner.prefix.inflight:
            return
        for req in waiting[: self.max_num_seqs]:
            if self.status(req) != Status.WAITING:
                continue
            match = self.planner.match_prefix(req.req_id, req.tokens, req.context_len)  # no unspill: not admitted
            if match.defer:
                _stop_at(rows, match.leader, match.branch)

    def _match(self, req: Request):
        """The prefix-cache admission of a waiting request (None when prefix caching is off)."""
        if self.planner.prefix is None:
            return None
        match = self.planner.match_prefix(req.req_id, req.tokens, req.context_len)
        if not match.unspill or match.defer:
            return match
        # entries spilled to the host tier come back now (or the match is the device's alone), so that the
        # chunk is cut from the prefix that is admitted; when the device has no room for them while others
        # run (this step's restores pin snapshot rows until it commits), the request waits a step instead
        admitted = self.manager.unspill(match, req.tokens)
        if admitted.tokens < match.tokens and self.running:
            return replace(admitted, defer=True, leader=None)
        return admitted

    def _chunk(self, req: Request, match, budget: int) -> int:
        """Tokens of the request's next context chunk: what is left after the cached prefix, in the budget,
        and ending at the next boundary where it saves a snapshot."""
        start = req.num_prefilled if match is None else match.tokens
        chunk = min(req.context_len - start, budget)
        if self.planner.prefix is not None:
            keeps = match.keeps if match is not None else self.planner.entry(req.req_id).keeps
            keep = next((b for b in keeps if b > start), None)
            if keep is not None:
                chunk = min(chunk, keep - start)
        self._last_chunk = chunk
        return chunk

    def _allocate_again(self, req: Request, match, budget: int) -> bool:
        match = self._match(req) if match is not None else None
        if match is not None and match.defer:
            return False
        return self.manager.allocate([req.req_id], self._chunk(req, match, budget), prefix=match)

    def _resplit_for(self, req: Request, waiting: bool) -> bool:
        """Re-split the device budget for a context chunk that does not fit: grow slots when it is a waiting
        request and none is free, else shrink idle slots into pages. Returns whether the split changed."""
        if waiting and self.planner.slot_pool.num_free == 0:
            return self._grow(req)
        return self._shrink(wants_slot=waiting)

    def _grow(self, blocked: Request) -> bool:
        if self.split is None:
            return False
        target = self.split.grow_to(self.planner.num_slots, self.running, blocked, self.known())
        return target is not None and self._resplit(target)

    def _shrink(self, wants_slot: bool) -> bool:
        if self.split is None or self.planner.slot_pool.num_free == 0:
            return False
        live, _ = self.planner.live_counts()
        target = self.split.shrink_to(self.planner.num_slots, live, wants_slot)
        return target is not None and self._resplit(target)

    def _resplit(self, num_slots: int) -> bool:
        mgr = self.manager
        if not (mgr.can_split(num_slots, self._longest_pages()) and mgr.can_rebalance(num_slots)):
            return False
        if mgr.pages_beside(num_slots) == mgr.num_pages:
            return False
        log.debug("re-split the device cache: %d -> %d slots", mgr.num_slots, num_slots)
        mgr.rebalance(num_slots)
        return True

    def _longest_pages(self) -> int:
        if self.split is None:
            return 0
        return max((self.split.whole_pages(r) for r in self.known()), default=0)

    def _pages_still_needed(self, requests: list[Request]) -> int:
        """Pages the requests may still allocate before reaching their whole length (reserve policy)."""
        if not self.planner.has_pages or self.split is None:
            return 0
        need = 0
        for r in requests:
            held = len(self.planner.entry(r.req_id).pages)
            need += max(0, self.split.whole_pages(r) - held)
        return need

    def _preempt(self, req: Request) -> None:
        """Suspend a generating request to the host tier when the policy prefers it and the host tier has
        room; otherwise drop it for re-prefill."""
        e = self.planner.entry(req.req_id)
        if e.status == Status.GENERATION:
            live = self.manager.sizing.request_bytes(e.num_tokens, self.planner.page_size)
            if self.preemption.swap(live, e.num_tokens):
                try:
                    self.manager.suspend([req.req_id])
                    log.debug("suspended request %r to the host tier", req.req_id)
                    self.running.remove(req)
                    _insert_sorted(self.suspended, req)
                    return
                except HostTierFullError:
                    pass
        self.manager.reprefill(req.req_id)
        log.debug("request %r will re-prefill", req.req_id)
        self.running.remove(req)
        req.num_prefilled = 0
        _insert_sorted(self.waiting, req)

    def _drop_kept_pages(self) -> bool:
        """Nothing runs and nothing fits: the device pages that suspended requests keep (their shared
        prefix) are the room left. Re-prefill the latest of them that keeps any; whether one was found."""
        keeping = [r for r in self.suspended if self.planner.entry(r.req_id).pages]
        if not keeping:
            return False
        req = keeping[-1]
        self.manager.reprefill(req.req_id)
        log.debug("request %r will re-prefill: its kept pages are the only room", req.req_id)
        self.suspended.remove(req)
        req.num_prefilled = 0
        _insert_sorted(self.waiting, req)
        return True

    def _remove(self, req: Request) -> None:
        for queue in (self.waiting, self.running, self.suspended):
            if req in queue:
                queue.remove(req)


def _stop_at(rows: list[tuple[Request, int]], req_id, boundary: int) -> int:
    """Cut the chunk of `req_id` scheduled in `rows` (if any) to end at `boundary` when it would pass it, so
    that it saves a snapshot there this step; returns the tokens freed. The pages it took for the longer
    chunk stay its own."""
    for i, (req, chunk) in enumerate(rows):
        if req.req_id == req_id and req.num_prefilled < boundary < req.num_prefilled + chunk:
            rows[i] = (req, boundary - req.num_prefilled)
            return chunk - rows[i][1]
    return 0


def _insert_sorted(queue: list[Request], req: Request) -> None:
    i = len(queue)
    while i > 0 and queue[i - 1].arrival > req.arrival:
        i -= 1
    queue.insert(i, req)
