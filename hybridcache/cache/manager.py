"""`HybridCacheManager`: a planner and a store behind one facade, for callers that plan and execute at once.

Every operation is a transaction: it completes, or the planner and the store are as before (a failed copy
releases its reservation and keeps the source; a failed step restarts its rows from their tokens).
"""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np
import torch

from . import prefix_moves, records
from .config import CacheConfig
from .entries import Entry, Status
from .errors import BudgetTooSmallError, InvalidTransitionError, LayoutError, OutOfDeviceMemoryError, StateLostError
from .host_tier import HostTier
from .live_state import read_live_state
from .planner import Planner
from .plans import StepPlan
from .prefix_cache import PrefixMatch
from .protocol import PageRoles, StateModule
from .role_plan import plan_roles
from .sizing import Sizing
from .step import StepIndices
from .store import CacheStore


class HybridCacheManager:
    """Owns every byte of every request's cache state: K/V pages and recurrent slots, in two tiers."""

    def __init__(self, states: Sequence[StateModule], pages: PageRoles | None, config: CacheConfig) -> None:
        self.config = config
        self.page_size = config.page_size
        self.device = torch.device(config.device)
        self.states = list(states)
        if pages is not None and getattr(pages, "page_size", config.page_size) != config.page_size:
            raise LayoutError(f"page roles use page_size {pages.page_size}, the config {config.page_size}")
        self.slot_roles, self.page_roles = plan_roles(self.states, pages)
        self.sizing = Sizing(tuple(self.slot_roles), tuple(self.page_roles))
        dummies = config.num_dummy_slots + config.num_snapshot_slots  # rows that keep their ids
        self.num_fixed = dummies
        num_slots, num_pages = self.sizing.device_split(config.device_bytes, config.num_slots, config.slot_share, dummies)
        share = self.sizing.bytes_for(num_slots + dummies, 0) / max(self.sizing.bytes_for(num_slots + dummies, num_pages), 1)
        host_slots, host_pages = HostTier.counts_for(
            config.host_bytes, self.slot_roles, self.page_roles, share, config.host_num_slots
        )
        self.planner = Planner(config.page_size, bool(self.page_roles), num_slots, num_pages, config.num_dummy_slots,
                               host_slots, host_pages, config.num_snapshot_slots, config.snapshot_interval)
        self.store = CacheStore(self.states, self.slot_roles, self.page_roles, config.device_bytes,
                                num_slots + dummies, num_pages, host_slots, host_pages, self.device)

    # ------------------------------------------------------------------ queries
    @property
    def stats(self) -> dict[str, int]:
        return self.planner.stats

    @property
    def num_free_slots(self) -> int:
        return self.planner.slot_pool.num_free

    @property
    def num_free_pages(self) -> int:
        return self.planner.page_pool.num_free

    @property
    def num_slots(self) -> int:
        """Device slots for requests (dummies excluded)."""
        return self.planner.num_slots

    @property
    def num_pages(self) -> int:
        return self.planner.num_pages

    @property
    def slot_pool(self):
        return self.planner.slot_pool

    @property
    def page_pool(self):
        return self.planner.page_pool

    @property
    def host_tier(self) -> HostTier:
        return self.store.host_tier

    @property
    def device_tier(self):
        return self.store.device_tier

    def entry(self, req_id: Hashable) -> Entry:
        return self.planner.entry(req_id)

    def status(self, req_id: Hashable) -> Status:
        return self.planner.status(req_id)

    def requests(self) -> list[Hashable]:
        return self.planner.requests()

    def state_tensors(self, module: StateModule | str) -> dict[str, torch.Tensor]:
        return self.store.state_tensors(module)

    def page_tensors(self) -> dict[str, torch.Tensor]:
        return self.store.page_tensors()

    def pages_needed(self, req_id: Hashable, num_new: int) -> int:
        return self.planner.pages_needed(req_id, num_new)

    def device_bytes_needed(self, num_tokens: int) -> int:
        return self.sizing.request_bytes(num_tokens, self.page_size)

    # ------------------------------------------------------------------ lifecycle
    def add_request(self, req_id: Hashable) -> None:
        """Register a request; it holds nothing until its first step."""
        self.planner.add(req_id)

    def add_dummy(self, req_id: Hashable) -> int:
        """Register a padding request on a permanent slot; returns the slot."""
        return self.planner.add_dummy(req_id)

    def start_generation(self, req_id: Hashable) -> None:
        self.planner.start_generation(req_id)

    def prepare_step(self, req_ids: Sequence[Hashable], num_new: Sequence[int] | int) -> StepIndices:
        """Allocate what the rows need for `num_new` more tokens and return the step's index tensors.

        A WAITING request gets a zeroed slot and becomes CONTEXT. Raises (changing nothing) on an
        unknown or suspended request, a repeated row, a count outside [1, 2^31), or too few free slots
        or pages.
        """
        planner = self.planner
        if not planner.allocate(req_ids, num_new):
            need = sum(planner.pages_needed(r, n) for r, n in zip(req_ids, np.broadcast_to(num_new, (len(req_ids),))))
            raise OutOfDeviceMemoryError(
                f"step needs {sum(planner.status(r) == Status.WAITING for r in req_ids)} slots and {need} pages; "
                f"{self.num_free_slots} slots and {self.num_free_pages} pages are free"
            )
        plan = planner.plan_step(req_ids, num_new)
        return self.execute(plan)

    def execute(self, plan: StepPlan) -> StepIndices:
        """Run the pending plan's store side; a failure aborts the step (its rows restart from their tokens)."""
        try:
            return self.store.execute(plan)
        except BaseException:
            self.abort_step()
            raise

    def accept(self, num_valid: Sequence[int] | torch.Tensor | np.ndarray | None = None) -> None:
        """Close the pending step: context rows commit all their tokens, generation rows `num_valid`
        (1..num_new: the fed token plus accepted drafts). Bad counts raise and leave the step pending."""
        plan = self._pending()
        accept = self.planner.check_accept(plan, num_valid)
        try:
            self.store.accept(accept)
        except BaseException:
            self.abort_step()
            raise
        self.planner.commit_step(plan, accept)

    def abort_step(self) -> list[Hashable]:
        """Drop the pending step: its rows may have been written, so every request in it restarts from
        its tokens (re-prefill) and dummies are zeroed. Returns the restarted requests."""
        plan = self._pending()
        dropped = self.planner.abort_step(plan)
        if plan.dummy.any():
            self.store.zero_slots(plan.slots[plan.dummy])
        return dropped

    @property
    def has_pending_step(self) -> bool:
        return self.planner.pending is not None

    def suspend(self, req_ids: Sequence[Hashable]) -> int:
        """Move generating requests' live pages and slot rows to the host tier; returns bytes moved.
        Raises HostTierFullError (changing nothing) when the host tier cannot hold them all."""
        return self._move(self.planner.plan_suspend(req_ids))

    def resume(self, req_ids: Sequence[Hashable], then_pages: int = 0) -> int:
        """Bring suspended requests back into any free device slots and pages, leaving room for
        `then_pages` more (their next step's growth); returns bytes moved. Raises OutOfDeviceMemoryError
        (nothing changed but cached prefix entries spilled or evicted) when they do not fit."""
        planner = self.planner
        if planner.prefix is not None:  # spill cached entries rather than drop them for the room it needs
            need = sum(len(planner.entry(r).host_pages) for r in req_ids if planner.entry(r).status == Status.SUSPENDED)
            self.spill(pages=need + then_pages - planner.page_pool.num_free)
        return self._move(planner.plan_resume(req_ids, then_pages))

    def allocate(self, req_ids: Sequence[Hashable], num_new: Sequence[int] | int, prefix: PrefixMatch | None = None) -> bool:
        """`Planner.allocate`, spilling the least valuable cached prefix entries to the host tier before any
        is dropped for room. A match that holds host-tier entries must come back first (`unspill`)."""
        planner, pc = self.planner, self.planner.prefix
        if pc is None:
            return planner.allocate(req_ids, num_new, prefix)
        pc.allow_drop, planner.short_pages = False, 0
        try:
            if planner.allocate(req_ids, num_new, prefix):
                return True
        finally:
            pc.allow_drop = True
        self.spill(pages=planner.short_pages, protect=prefix.nodes if prefix is not None else ())
        return planner.allocate(req_ids, num_new, prefix)

    def spill(self, pages: int = 0, snapshots: int = 0, protect=()) -> int:
        """Move unpinned cached entries to the host tier until `pages` device pages and `snapshots` snapshot
        rows are freed, as far as the host tier has room. A failed copy changes nothing (logged). Returns
        the bytes moved."""
        return prefix_moves.spill(self.planner, self.store, pages, snapshots, tuple(protect))

    def unspill(self, match: PrefixMatch, tokens: Sequence[int] = ()) -> PrefixMatch:
        """Bring a match's host-tier pages and snapshot back to the device; returns the match to admit. When
        the device has no room or the copy fails (nothing changed), the match the device alone gives for
        the request's `tokens` (the ones matched; without them no partial page can match)."""
        return prefix_moves.unspill(self.planner, self.store, match, tokens)

    def save_snapshots(self, tokens_of, ends: Sequence[Hashable] = ()) -> int:
        """After a committed step, save the prefix-cache snapshots its rows reached, and the committed end
        of the requests `ends` (that finish now, before they are freed); `tokens_of(req_id)` gives a
        request's tokens through its committed ones. Returns how many were saved (`prefix_moves`)."""
        return prefix_moves.save_snapshots(self.planner, self.store, tokens_of, ends)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix entry no request uses, device and host tier (`Planner.reset_prefix`);
        returns whether nothing cached is left (False too with prefix caching off). Refused
        (InvalidTransitionError) while a step or move is pending."""
        self.planner.reset_prefix()
        return self.planner.prefix is not None and self.planner.prefix.empty

    @property
    def snapshot_bytes(self) -> int:
        """Device bytes of the prefix-cache snapshot rows held now."""
        prefix = self.planner.prefix
        return 0 if prefix is None else prefix.snap_pool.num_owned * self.sizing.bytes_per_slot

    def reprefill(self, req_id: Hashable) -> None:
        """Drop everything the request holds (either tier); its next step starts its context from zero."""
        self.planner.reprefill(req_id)

    def free(self, req_id: Hashable) -> None:
        """Forget the request and release everything it holds, in every tier."""
        self.planner.free(req_id)

    def pages_beside(self, num_slots: int) -> int:
        """Pages that fit the device budget beside `num_slots` request slots (and the dummies)."""
        return self.sizing.split(self.config.device_bytes, num_slots + self.num_fixed)

    def can_split(self, num_slots: int, min_pages: int = 0) -> bool:
        """Whether `num_slots` request slots fit the budget with at least `min_pages` pages beside them."""
        if num_slots < 1 or self.sizing.bytes_for(num_slots + self.num_fixed, 0) > self.config.device_bytes:
            return False
        return self.pages_beside(num_slots) >= min_pages

    def can_rebalance(self, num_slots: int) -> bool:
        """Whether the live requests fit `num_slots` slots and the pages left beside them."""
        if num_slots < 1 or self.sizing.bytes_for(num_slots + self.num_fixed, 0) > self.config.device_bytes:
            return False
        live, pages = self.planner.live_counts()
        return live <= num_slots and pages <= self.pages_beside(num_slots)

    def rebalance(self, num_slots: int) -> int:
        """Re-split the device budget into `num_slots` request slots and as many pages as fit.

        Every live request's slot rows (every role, replay history included) and pages move to the new
        carving; dummies keep their slots. Raises OutOfDeviceMemoryError or BudgetTooSmallError
        (changing nothing) when the live requests would not fit; StateLostError when a copy failed and
        the old carving could not be restored (the live requests then restart from their tokens).
        Returns the bytes moved each way.
        """
        if num_slots < 1:
            raise BudgetTooSmallError(f"num_slots must be >= 1, got {num_slots}")
        plan = self.planner.plan_rebalance(num_slots, self.pages_beside(num_slots))
        try:
            moved = self.store.recarve(plan)
        except StateLostError:
            self.planner.cancel_rebalance(plan, state_lost=True)
            raise
        except BaseException:
            self.planner.cancel_rebalance(plan, state_lost=False)
            raise
        self.planner.commit_rebalance(plan)
        return moved

    # ------------------------------------------------------------------ transfer between engines
    def export_records(self, req_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """A generating request's live bytes as a suspend would save them, changing nothing: its slot record
        `[slot nbytes]` and the page records of its committed tokens `[live pages, page nbytes]` (uint8,
        host memory; layouts `host_tier.slot_layout` / `page_layout`)."""
        return records.export_records(self.planner, self.store, req_id)

    def adopt(self, req_id: Hashable, num_tokens: int, slot_record: torch.Tensor, page_records: torch.Tensor) -> None:
        """Register a request suspended elsewhere (`export_records` of an engine with the same layouts): it
        becomes SUSPENDED here with `num_tokens` committed, and `resume` brings it to the device. Raises
        (changing nothing) on a duplicate id, records of the wrong shape, or a full host tier."""
        records.adopt(self.planner, self.store, req_id, num_tokens, slot_record, page_records)

    # ------------------------------------------------------------------ inspection
    def live_state(self, req_id: Hashable) -> dict[str, torch.Tensor]:
        """A copy of the request's live bytes by role: slot roles `[layers, *live_shape]`, page roles
        `[layers, live_pages, *shape]`; read from whichever tier holds it (for tests and debugging)."""
        self.store.synchronize()
        e = self.planner.entry(req_id)
        return read_live_state(self.store, e, self.planner.live_pages(e))

    def check_integrity(self) -> None:
        """Raise IntegrityError unless every slot and page has at most one owner and, per tier,
        free + owned + permanent == total."""
        self.planner.check_integrity()

    def synchronize(self) -> None:
        self.store.synchronize()

    # ------------------------------------------------------------------ internals
    def _pending(self) -> StepPlan:
        plan = self.planner.pending
        if plan is None:
            raise InvalidTransitionError("no prepared step")
        return plan

    def _move(self, plan) -> int:
        try:
            moved = self.store.copy(plan)
        except BaseException:
            self.planner.cancel_move(plan)
            raise
        self.planner.commit_move(plan, moved)
        return moved


__all__ = ["HybridCacheManager"]
