"""Who runs this step. Default policy, maximum utilisation: admit while there is room now; when a
generating request cannot grow, suspend the most recent arrivals to the host tier (re-prefill them
when the host tier is full); resume suspended requests first when room returns. The `reserve` policy
admits a request only when the pages of its whole length (prompt + max_tokens) are free beside what the
running requests may still grow into, so growth never preempts.

The scheduler asks the cache manager yes/no questions and moves requests between its queues; it never
touches a tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..cache import HostTierFullError, HybridCacheManager
from .request import Phase, Request


POLICIES = ("max_utilization", "reserve")


@dataclass
class ScheduledStep:
    context: list[tuple[Request, int]] = field(default_factory=list)  # (request, chunk tokens)
    generation: list[Request] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.context and not self.generation


class Scheduler:
    def __init__(
        self, manager: HybridCacheManager, max_num_seqs: int, max_num_batched_tokens: int, generation_tokens: int,
        policy: str = "max_utilization",
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {policy!r}; choose from {POLICIES}")
        self.policy = policy
        self.manager = manager
        self.max_num_seqs = max_num_seqs
        self.token_budget = max_num_batched_tokens
        self.T = generation_tokens
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # PREFILL or DECODE, holding device state
        self.suspended: list[Request] = []

    def add(self, req: Request) -> None:
        self.manager.add_request(req.req_id)
        self._enqueue_waiting(req)

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self.manager.free(req.req_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.suspended)

    def schedule(self) -> ScheduledStep:
        self._resume_suspended()
        step = ScheduledStep()
        step.generation = self._generation_rows()
        step.context = self._context_rows(step.generation)
        while step.empty and self.running:
            # everyone is stuck (prefills holding pages): free room by preempting the latest arrival
            self._preempt(self.running[-1])
            self._resume_suspended()
            step.generation = self._generation_rows()
            step.context = self._context_rows(step.generation)
        return step

    def rebalance(self, num_slots: int) -> int:
        """Re-split the device cache into `num_slots` slots and the pages that fit beside them, first
        preempting the most recent arrivals until the live requests fit. Returns the bytes moved."""
        mgr = self.manager
        if num_slots < 1 or mgr.sizing.bytes_for(num_slots + mgr.config.num_dummy_slots, 0) > mgr.config.device_bytes:
            raise ValueError(f"{num_slots} slots do not fit the device budget of {mgr.config.device_bytes} bytes")
        while self.running and not mgr.can_rebalance(num_slots):
            self._preempt(self.running[-1])
        return self.manager.rebalance(num_slots)

    # -------------------------------------------------------------------------------------------
    def _resume_suspended(self) -> None:
        while self.suspended and len(self.running) < self.max_num_seqs:
            req = self.suspended[0]
            if not self.manager.can_resume([req.req_id]):
                return
            self.manager.resume([req.req_id])
            self.suspended.pop(0)
            req.phase = Phase.DECODE
            self._insert_running(req)

    def _generation_rows(self) -> list[Request]:
        while True:
            gen = [r for r in self.running if r.phase == Phase.DECODE]
            if not gen or self.manager.can_prepare([r.req_id for r in gen], [self.T] * len(gen)):
                return gen
            self._preempt(self.running[-1])

    def _context_rows(self, generation: list[Request]) -> list[tuple[Request, int]]:
        mgr = self.manager
        budget = self.token_budget - self.T * len(generation)
        free_slots = mgr.num_free_slots
        free_pages = mgr.num_free_pages - sum(mgr.pages_needed(r.req_id, self.T) for r in generation)
        rows: list[tuple[Request, int]] = []
        candidates = [r for r in self.running if r.phase == Phase.PREFILL] + list(self.waiting)
        reserved = self._pages_still_needed(self.running) if self.policy == "reserve" else 0
        for req in candidates:
            if budget <= 0:
                break
            if req.phase == Phase.WAITING and len(self.running) >= self.max_num_seqs:
                break
            if req.phase == Phase.WAITING and self.policy == "reserve":
                whole = self._pages_still_needed([req])
                if reserved + whole > mgr.num_free_pages:
                    break
                reserved += whole
            chunk = min(req.context_len - req.num_prefilled, budget)
            need_slot, need_pages = int(req.phase == Phase.WAITING), mgr.pages_needed(req.req_id, chunk)
            if need_slot > free_slots or need_pages > free_pages:  # what prepare_step would refuse
                break
            free_slots, free_pages = free_slots - need_slot, free_pages - need_pages
            rows.append((req, chunk))
            budget -= chunk
            if req.phase == Phase.WAITING:
                self.waiting.remove(req)
                req.phase = Phase.PREFILL
                self._insert_running(req)
        return rows

    def _pages_still_needed(self, requests: list[Request]) -> int:
        """Pages the requests may still allocate before reaching their whole length (reserve policy)."""
        mgr, need = self.manager, 0
        if not mgr.page_roles:
            return 0
        for r in requests:
            whole = -(-(len(r.prompt) + r.params.max_tokens + self.T) // mgr.page_size)
            held = len(mgr.entry(r.req_id).pages) if r.phase in (Phase.PREFILL, Phase.DECODE) else 0
            need += max(0, whole - held)
        return need

    def _preempt(self, req: Request) -> None:
        """Suspend a generating request to the host tier, or drop it for re-prefill."""
        self.running.remove(req)
        if req.phase == Phase.DECODE:
            try:
                self.manager.suspend([req.req_id])
                req.phase = Phase.SUSPENDED
                self._insert_sorted(self.suspended, req)
                return
            except HostTierFullError:
                pass
        self.manager.reprefill(req.req_id)
        req.phase, req.num_prefilled = Phase.WAITING, 0
        self._enqueue_waiting(req)

    def _enqueue_waiting(self, req: Request) -> None:
        self._insert_sorted(self.waiting, req)

    def _insert_running(self, req: Request) -> None:
        self._insert_sorted(self.running, req)

    @staticmethod
    def _insert_sorted(queue: list[Request], req: Request) -> None:
        i = len(queue)
        while i > 0 and queue[i - 1].arrival > req.arrival:
            i -= 1
        queue.insert(i, req)
