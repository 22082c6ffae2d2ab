"""The planner's request lifecycle: register, start generating, re-prefill, free; and the two-phase moves
between tiers (suspend, resume, adopt from another engine): `plan_*` reserves the destination ids, the
store copies, `commit_move` releases the source or `cancel_move` the reservation."""
from __future__ import annotations

from typing import Hashable, Sequence

from ..entries import Entry, Status, pages_for
from ..errors import (
    DuplicateRequestError,
    HostTierFullError,
    InvalidCountError,
    InvalidTransitionError,
    OutOfDeviceMemoryError,
)
from ..counts import MAX_TOKENS
from ..plans import MovePlan
from .core import FREED_REMEMBERED, PlannerCore


class Lifecycle(PlannerCore):
    # ------------------------------------------------------------------ lifecycle
    def add(self, req_id: Hashable) -> None:
        """Register a request; it holds nothing until it is allocated."""
        if req_id in self._entries:
            raise DuplicateRequestError(f"request {req_id!r} already exists")
        self._freed.pop(req_id, None)
        self._entries[req_id] = Entry(req_id, Status.WAITING, self._tokens, self._tokens.take())

    def add_dummy(self, req_id: Hashable) -> int:
        """Register a padding request on a permanent slot; returns the slot."""
        if req_id in self._entries:
            raise DuplicateRequestError(f"request {req_id!r} already exists")
        if not self._free_dummy_slots:
            raise OutOfDeviceMemoryError(f"all {self.num_dummies} dummy slots are taken")
        slot = self._free_dummy_slots.pop()
        self._freed.pop(req_id, None)
        self._entries[req_id] = Entry(req_id, Status.DUMMY, self._tokens, self._tokens.take(), slot=slot)
        return slot

    def start_generation(self, req_id: Hashable) -> None:
        """The context is fully prefilled: later steps are decode / verify steps."""
        e = self.entry(req_id)
        if e.status != Status.CONTEXT:
            raise InvalidTransitionError(f"request {req_id!r} is {e.status.name}, not CONTEXT")
        self._require_idle()
        e.status = Status.GENERATION
        if self.prefix is not None:
            self.prefix.left_context(e)
        self._layout = None

    def reprefill(self, req_id: Hashable) -> None:
        """Drop everything the request holds (either tier); its next step starts its context from zero."""
        self._require_idle()
        self._require_settled()
        e = self.entry(req_id)
        if e.status in (Status.WAITING, Status.DUMMY):
            raise InvalidTransitionError(f"request {req_id!r} is {e.status.name}; nothing to re-prefill")
        self._release(e)
        e.status, e.num_tokens = Status.WAITING, 0
        self.stats["reprefills"] += 1

    def free(self, req_id: Hashable) -> None:
        """Forget the request and release everything it holds, in every tier."""
        self._require_idle()
        e = self.entry(req_id)
        if e.status == Status.DUMMY:
            self._free_dummy_slots.append(e.slot)
        else:
            self._release(e)
        del self._entries[req_id]
        self._tokens.give_back(e.handle)
        self._freed[req_id] = None
        if len(self._freed) > FREED_REMEMBERED:
            del self._freed[next(iter(self._freed))]
        e.status = Status.FINISHED
        self._layout = None

    # ------------------------------------------------------------------ moves between tiers
    def plan_suspend(self, req_ids: Sequence[Hashable]) -> MovePlan:
        """Reserve host ids for generating requests' live bytes. Raises HostTierFullError (changing
        nothing) when the host tier cannot hold them all."""
        self._require_idle()
        self._require_settled()
        entries = self._distinct(req_ids)
        for e in entries:
            if e.status != Status.GENERATION:
                what = "a dummy; dummies are never suspended" if e.status == Status.DUMMY else e.status.name
                raise InvalidTransitionError(f"request {e.req_id!r} is {what}; only GENERATION can suspend")
        live = [e.pages[self.kept_pages(e) : self.live_pages(e)] for e in entries]  # shared pages stay
        need = sum(map(len, live))
        hs, hp = self.host_slot_pool, self.host_page_pool
        if not self.make_host_room(len(entries), need):  # spilled prefix entries go first
            raise HostTierFullError(
                f"host tier has {hs.num_free} slots and {hp.num_free} pages free; suspending needs {len(entries)} and {need}"
            )
        plan = MovePlan(
            req_ids=tuple(e.req_id for e in entries), to_host=True, slots=tuple(e.slot for e in entries),
            host_slots=tuple(hs.allocate(len(entries))), pages=tuple(p for ps in live for p in ps),
            host_pages=tuple(hp.allocate(need)), page_counts=tuple(map(len, live)),
        )
        self._moving = plan
        return plan

    def plan_resume(self, req_ids: Sequence[Hashable], then_pages: int = 0) -> MovePlan:
        """Reserve device slots and pages for suspended requests, when `then_pages` more would still be free
        (unreserved) beside them. Raises OutOfDeviceMemoryError (changing nothing but cached prefix entries
        evicted for room) when the device has too little free."""
        self._require_idle()
        self._require_settled()
        entries = self._distinct(req_ids)
        for e in entries:
            if e.status != Status.SUSPENDED:
                raise InvalidTransitionError(f"request {e.req_id!r} is {e.status.name}, not SUSPENDED")
        need = sum(len(e.host_pages) for e in entries)
        if len(entries) > self.slot_pool.num_free or not self._room(need + then_pages):
            raise OutOfDeviceMemoryError(
                f"resume needs {len(entries)} slots and {need} pages; "
                f"{self.slot_pool.num_free} and {self.page_pool.num_free} are free"
            )
        plan = MovePlan(
            req_ids=tuple(e.req_id for e in entries), to_host=False, slots=tuple(self.slot_pool.allocate(len(entries))),
            host_slots=tuple(e.host_slot for e in entries), pages=tuple(self.page_pool.allocate(need)),
            host_pages=tuple(p for e in entries for p in e.host_pages),
            page_counts=tuple(len(e.host_pages) for e in entries),
        )
        self._moving = plan
        return plan

    def commit_move(self, plan: MovePlan, nbytes: int) -> None:
        """The copies are done: the requests now live in the destination tier; the source ids are freed."""
        self._require_moving(plan)
        entries = [self._entries[r] for r in plan.req_ids]
        pages = _split(plan.pages, plan.page_counts)
        host_pages = _split(plan.host_pages, plan.page_counts)
        for e, s, hs, ps, hps in zip(entries, plan.slots, plan.host_slots, pages, host_pages):
            if plan.to_host:  # it keeps its shared pages (the first live - copied ones) on the device
                kept = self.live_pages(e) - len(hps)
                self.slot_pool.release([e.slot])
                self.page_pool.release(e.pages[kept:])
                e.slot, e.pages, e.host_slot, e.host_pages, e.status = -1, e.pages[:kept], hs, hps, Status.SUSPENDED
            else:
                self.host_slot_pool.release([e.host_slot])
                self.host_page_pool.release(e.host_pages)
                e.slot, e.pages, e.host_slot, e.host_pages, e.status = s, e.pages + ps, -1, [], Status.GENERATION
        key = ("suspensions", "bytes_to_host") if plan.to_host else ("resumes", "bytes_to_device")
        self.stats[key[0]] += len(entries)
        self.stats[key[1]] += nbytes
        self._moving = None
        self._layout = None

    def cancel_move(self, plan: MovePlan) -> None:
        """The copies failed: release the reserved destination ids; the source is untouched."""
        self._require_moving(plan)
        dst_slots, dst_pages = (self.host_slot_pool, self.host_page_pool) if plan.to_host else (self.slot_pool, self.page_pool)
        dst_slots.release(list(plan.host_slots if plan.to_host else plan.slots))
        dst_pages.release(list(plan.host_pages if plan.to_host else plan.pages))
        self._moving = None

    def plan_adopt(self, req_id: Hashable, num_tokens: int) -> MovePlan:
        """Reserve a host slot and the host pages of `num_tokens` committed tokens for a request whose live
        bytes come from another engine (disaggregated prefill); the store writes them, then `commit_adopt`
        registers the request SUSPENDED (or `cancel_move` releases the ids). Raises DuplicateRequestError,
        InvalidCountError or HostTierFullError, changing nothing."""
        self._require_idle()
        self._require_settled()
        if req_id in self._entries:
            raise DuplicateRequestError(f"request {req_id!r} already exists")
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not 0 < num_tokens <= MAX_TOKENS:
            raise InvalidCountError(f"an adopted request holds 1..{MAX_TOKENS} tokens, got {num_tokens!r}")
        need = pages_for(num_tokens, self.page_size) if self.has_pages else 0
        hs, hp = self.host_slot_pool, self.host_page_pool
        if not self.make_host_room(1, need):
            raise HostTierFullError(f"host tier has {hs.num_free} slots and {hp.num_free} pages free; adopting needs 1 and {need}")
        plan = MovePlan(req_ids=(req_id,), to_host=True, slots=(), host_slots=tuple(hs.allocate(1)), pages=(),
                        host_pages=tuple(hp.allocate(need)), page_counts=(need,))
        self._moving = plan
        return plan

    def commit_adopt(self, plan: MovePlan, num_tokens: int) -> None:
        """The adopted request's bytes are in its host records: it is SUSPENDED with `num_tokens` committed."""
        self._require_moving(plan)
        (req_id,) = plan.req_ids
        self._freed.pop(req_id, None)
        e = Entry(req_id, Status.SUSPENDED, self._tokens, self._tokens.take(), host_slot=plan.host_slots[0],
                  host_pages=list(plan.host_pages))
        e.num_tokens = num_tokens
        self._entries[req_id] = e
        self._moving = None


def _split(flat: tuple[int, ...], counts: tuple[int, ...]) -> list[list[int]]:
    out, i = [], 0
    for n in counts:
        out.append(list(flat[i : i + n]))
        i += n
    return out
