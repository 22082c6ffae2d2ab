"""`HybridCacheManager`: the facade the engine uses for pages, slots, tiers and the request lifecycle."""
from __future__ import annotations

from typing import Hashable, Iterable, Sequence

import numpy as np
import torch

from . import rebalance, tiering
from .config import CacheConfig
from .copy_engine import CopyEngine
from .device_tier import DeviceTier
from .entries import Entry, Status, TokenCounts, pages_for
from .errors import (
    DoubleFreeError,
    DuplicateRequestError,
    InvalidTransitionError,
    LayoutError,
    OutOfDeviceMemoryError,
    UnknownRequestError,
)
from .host_tier import HostTier
from .id_pool import IdPool
from .inspect import live_state
from .integrity import check_integrity
from .plan import plan_roles
from .sizing import Sizing
from .protocol import PageRoles, StateModule
from .step import Batch, StepIndices


class HybridCacheManager:
    """Owns every byte of every request's cache state: K/V pages and recurrent slots, in two tiers."""

    def __init__(
        self,
        states: Sequence[StateModule],
        pages: PageRoles | None,
        config: CacheConfig,
    ) -> None:
        self.config = config
        self.page_size = config.page_size
        self.device = torch.device(config.device)
        self.states = list(states)
        if pages is not None and getattr(pages, "page_size", config.page_size) != config.page_size:
            raise LayoutError(f"page roles use page_size {pages.page_size}, the config {config.page_size}")
        self.slot_roles, self.page_roles = plan_roles(self.states, pages)
        self.sizing = Sizing(tuple(self.slot_roles), tuple(self.page_roles))

        dummies = config.num_dummy_slots
        num_slots, num_pages = self.sizing.device_split(config.device_bytes, config.num_slots, config.slot_share, dummies)
        self.device_tier = DeviceTier(self.slot_roles, self.page_roles, config.device_bytes, self.device)
        self.device_tier.carve(num_slots + dummies, num_pages)
        self.slot_pool = IdPool(num_slots + dummies, permanent=dummies)
        self.page_pool = IdPool(num_pages)
        share = self.sizing.bytes_for(num_slots + dummies, 0) / max(self.sizing.bytes_for(num_slots + dummies, num_pages), 1)
        host_slots, host_pages = HostTier.counts_for(
            config.host_bytes, self.slot_roles, self.page_roles, share, config.host_num_slots
        )
        pin = self.device.type == "cuda"
        self.host_tier = HostTier(self.slot_roles, self.page_roles, host_slots, host_pages, pin)
        self.copies = CopyEngine(self.device)
        self._tokens = TokenCounts()
        self._batch: Batch | None = None
        self._entries: dict[Hashable, Entry] = {}
        self._freed: set[Hashable] = set()
        self._free_dummy_slots = list(range(dummies - 1, -1, -1))
        self._pending: tuple[Batch, np.ndarray] | None = None
        self.stats = {"suspensions": 0, "resumes": 0, "reprefills": 0, "bytes_to_host": 0, "bytes_to_device": 0}

    # ------------------------------------------------------------------ queries
    @property
    def num_free_slots(self) -> int:
        return self.slot_pool.num_free

    @property
    def num_free_pages(self) -> int:
        return self.page_pool.num_free

    @property
    def num_slots(self) -> int:
        """Device slots for requests (dummies excluded)."""
        return self.slot_pool.total - self.slot_pool.permanent

    @property
    def num_pages(self) -> int:
        return self.page_pool.total

    def entry(self, req_id: Hashable) -> Entry:
        e = self._entries.get(req_id)
        if e is None:
            if req_id in self._freed:
                raise DoubleFreeError(f"request {req_id!r} was already freed")
            raise UnknownRequestError(f"unknown request {req_id!r}")
        return e

    def status(self, req_id: Hashable) -> Status:
        return self.entry(req_id).status

    def requests(self) -> list[Hashable]:
        return list(self._entries)

    def state_tensors(self, module: StateModule | str) -> dict[str, torch.Tensor]:
        """Device role tensors `[layers, slots, ...]` of one state module, by local role name (the tier's
        own mapping, rebuilt by a rebalance: read it, do not keep it across one)."""
        return self.device_tier.by_module[module if isinstance(module, str) else module.name]

    def page_tensors(self) -> dict[str, torch.Tensor]:
        """Device page role tensors `[layers, pages, ...]` by full role name (same caveat)."""
        return self.device_tier.pages

    def pages_needed(self, req_id: Hashable, num_new: int) -> int:
        e = self.entry(req_id)
        if e.status == Status.DUMMY or not self.page_roles:
            return 0
        return max(0, pages_for(e.num_tokens + num_new, self.page_size) - len(e.pages))

    def can_prepare(self, req_ids: Sequence[Hashable], num_new: Sequence[int]) -> bool:
        """Whether `prepare_step` would find enough free device slots and pages right now."""
        slots = sum(1 for r in req_ids if self.entry(r).status == Status.WAITING)
        pages = sum(self.pages_needed(r, n) for r, n in zip(req_ids, num_new))
        return slots <= self.slot_pool.num_free and pages <= self.page_pool.num_free

    def can_resume(self, req_ids: Sequence[Hashable]) -> bool:
        entries = [self.entry(r) for r in req_ids]
        pages = sum(len(e.host_pages) for e in entries)
        return len(entries) <= self.slot_pool.num_free and pages <= self.page_pool.num_free

    def device_bytes_needed(self, num_tokens: int) -> int:
        return self.sizing.request_bytes(num_tokens, self.page_size)

    # ------------------------------------------------------------------ lifecycle
    def add_request(self, req_id: Hashable) -> None:
        """Register a request; it holds nothing until its first step."""
        if req_id in self._entries:
            raise DuplicateRequestError(f"request {req_id!r} already exists")
        self._freed.discard(req_id)
        self._entries[req_id] = Entry(req_id, Status.WAITING, self._tokens, self._tokens.take())

    def add_dummy(self, req_id: Hashable) -> int:
        """Register a padding request on a permanent slot; returns the slot."""
        if req_id in self._entries:
            raise DuplicateRequestError(f"request {req_id!r} already exists")
        if not self._free_dummy_slots:
            raise OutOfDeviceMemoryError(f"all {self.config.num_dummy_slots} dummy slots are taken")
        slot = self._free_dummy_slots.pop()
        self._freed.discard(req_id)
        self._entries[req_id] = Entry(req_id, Status.DUMMY, self._tokens, self._tokens.take(), slot=slot)
        return slot

    def start_generation(self, req_id: Hashable) -> None:
        """The context is fully prefilled: later steps are decode / verify steps."""
        e = self.entry(req_id)
        if e.status != Status.CONTEXT:
            raise InvalidTransitionError(f"request {req_id!r} is {e.status.name}, not CONTEXT")
        self._require_no_pending()
        e.status = Status.GENERATION
        self._batch = None

    def prepare_step(self, req_ids: Sequence[Hashable], num_new: Sequence[int] | int) -> StepIndices:
        """Allocate what the rows need for `num_new` more tokens and return the step's index tensors.

        A WAITING request gets a zeroed slot and becomes CONTEXT. Raises (changing nothing) on an
        unknown or suspended request, a repeated row, or too few free slots or pages. When the rows are
        those of the previous step, only what changed is recomputed.
        """
        self._require_no_pending()
        key = tuple(req_ids)
        batch = self._batch
        if batch is None or batch.key != key:
            batch = self._new_batch(key)
        n = np.full(len(key), num_new, dtype=np.int64) if isinstance(num_new, int) else np.asarray(num_new, dtype=np.int64)
        if n.shape != (len(key),):
            raise ValueError(f"{len(key)} rows but {n.size} token counts")
        if n.size and n.min() < 0:
            raise ValueError(f"negative token count in {n.tolist()}")
        cached = self._tokens.counts[batch.handles]
        grow = -(-(cached + n) // self.page_size) - batch.npages
        grow[batch.dummy] = 0
        if not self.page_roles:  # a model without attention layers holds no pages
            grow[:] = 0
        grow_rows = np.flatnonzero(grow > 0).tolist()
        fresh_rows = batch.waiting_rows
        need_pages = int(grow[grow_rows].sum()) if grow_rows else 0
        if len(fresh_rows) > self.slot_pool.num_free or need_pages > self.page_pool.num_free:
            raise OutOfDeviceMemoryError(
                f"step needs {len(fresh_rows)} slots and {need_pages} pages; "
                f"{self.slot_pool.num_free} slots and {self.page_pool.num_free} pages are free"
            )
        self._batch = batch
        if fresh_rows:
            slots = self.slot_pool.allocate(len(fresh_rows))
            for row, slot in zip(fresh_rows, slots):
                e = batch.entries[row]
                e.slot, e.status = slot, Status.CONTEXT
                batch.set_slot(row, slot)
            self._zero_slots(slots)
            batch.waiting_rows = []
        if grow_rows:
            new_pages = [self.page_pool.allocate(int(grow[r])) for r in grow_rows]
            for r, pages in zip(grow_rows, new_pages):
                batch.entries[r].pages.extend(pages)
            batch.add_pages(grow_rows, new_pages)
        self.copies.fence()
        self._pending = (batch, n)
        num_new_t = batch.num_new_tensor(n, num_new if isinstance(num_new, int) else None)
        return batch.indices(cached, n, num_new_t, fresh_rows)

    def accept(self, num_valid: Sequence[int] | torch.Tensor | np.ndarray | None = None) -> None:
        """Close the prepared step: context rows commit all their tokens, generation rows `num_valid`.

        `num_valid[i]` (1..num_new) counts the row's tokens now valid: the fed token plus accepted drafts.
        Entries of non-generation rows are ignored.
        """
        if self._pending is None:
            raise InvalidTransitionError("no prepared step to accept")
        batch, n = self._pending
        if num_valid is None:
            valid = n
        else:
            if isinstance(num_valid, torch.Tensor):
                num_valid = num_valid.cpu().numpy()
            valid = np.asarray(num_valid, dtype=np.int64)
            if valid.shape != n.shape:
                raise ValueError(f"{n.size} rows but {valid.size} accept counts")
            g = batch.gen_mask & (n > 0)
            bad = g & ((valid < 1) | (valid > n))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"request {batch.entries[i].req_id!r}: {valid[i]} valid tokens of {n[i]}")
        commit = np.where(batch.gen_mask, valid, n)
        commit[batch.dummy] = 0
        self._tokens.counts[batch.handles] += commit
        if batch.gen_rows:
            rows = batch.gen_rows
            tokens = torch.from_numpy(n[rows].astype(np.int32)).to(self.device)
            accepted = torch.from_numpy(valid[rows].astype(np.int32)).to(self.device)
            for m in self.states:
                m.on_accept(self.state_tensors(m), batch.gen_slots, tokens, accepted)
        self._pending = None

    def cancel_step(self) -> None:
        """Drop a prepared step without committing tokens (what it allocated stays with the rows)."""
        self._pending = None

    def _new_batch(self, key: tuple) -> Batch:
        if len(set(key)) != len(key):
            raise ValueError("a request appears twice in one step")
        entries = [self.entry(r) for r in key]
        for e in entries:
            if e.status == Status.SUSPENDED:
                raise InvalidTransitionError(f"request {e.req_id!r} is suspended; resume it first")
        return Batch(key, entries, self.device)

    def suspend(self, req_ids: Sequence[Hashable]) -> int:
        """Move generating requests' live pages and slot rows to the host tier; returns bytes moved.

        Raises HostTierFullError (changing nothing) when the host tier cannot hold them all.
        """
        self._require_no_pending()
        entries = self._distinct(req_ids)
        for e in entries:
            if e.status == Status.DUMMY:
                raise InvalidTransitionError(f"request {e.req_id!r} is a dummy; dummies are never suspended")
            if e.status != Status.GENERATION:
                raise InvalidTransitionError(f"request {e.req_id!r} is {e.status.name}; only GENERATION can suspend")
        moved = tiering.to_host(self, entries)
        self._note_move("suspensions", len(entries), "bytes_to_host", moved)
        return moved

    def resume(self, req_ids: Sequence[Hashable]) -> int:
        """Bring suspended requests back into any free device slots and pages; returns bytes moved."""
        self._require_no_pending()
        entries = self._distinct(req_ids)
        for e in entries:
            if e.status != Status.SUSPENDED:
                raise InvalidTransitionError(f"request {e.req_id!r} is {e.status.name}, not SUSPENDED")
        moved = tiering.to_device(self, entries)
        self._note_move("resumes", len(entries), "bytes_to_device", moved)
        return moved

    def reprefill(self, req_id: Hashable) -> None:
        """Drop everything the request holds (either tier); its next step starts its context from zero."""
        self._require_no_pending()
        e = self.entry(req_id)
        if e.status in (Status.WAITING, Status.DUMMY):
            raise InvalidTransitionError(f"request {req_id!r} is {e.status.name}; nothing to re-prefill")
        self._release(e)
        e.status, e.num_tokens = Status.WAITING, 0
        self.stats["reprefills"] += 1

    def free(self, req_id: Hashable) -> None:
        """Forget the request and release everything it holds, in every tier."""
        self._require_no_pending()
        e = self.entry(req_id)
        if e.status == Status.DUMMY:
            self._free_dummy_slots.append(e.slot)
        else:
            self._release(e)
        del self._entries[req_id]
        self._tokens.give_back(e.handle)
        self._freed.add(req_id)
        self._batch = None

    def can_rebalance(self, num_slots: int) -> bool:
        """Whether the live requests fit `num_slots` slots and the pages left beside them."""
        return rebalance.fits(self, num_slots)

    def rebalance(self, num_slots: int) -> int:
        """Re-split the device budget into `num_slots` request slots and as many pages as fit.

        Every live request's slot rows (every role, replay history included) and pages move to the new
        carving; dummies keep their slots. Raises OutOfDeviceMemoryError (changing nothing) when the live
        requests would not fit. Returns the bytes moved each way.
        """
        self._require_no_pending()
        moved = rebalance.recarve(self, num_slots)
        self._batch = None
        return moved

    # ------------------------------------------------------------------ inspection
    def live_state(self, req_id: Hashable) -> dict[str, torch.Tensor]:
        """A copy of the request's live bytes by role: slot roles `[layers, *live_shape]`, page roles
        `[layers, live_pages, *shape]`; read from whichever tier holds it (for tests and debugging)."""
        self.copies.synchronize()
        return live_state(self, self.entry(req_id))

    def check_integrity(self) -> None:
        """Raise IntegrityError unless every slot and page has at most one owner and, per tier,
        free + owned + permanent == total."""
        check_integrity(self)

    def synchronize(self) -> None:
        self.copies.synchronize()

    # ------------------------------------------------------------------ internals
    def _require_no_pending(self) -> None:
        if self._pending is not None:
            raise InvalidTransitionError("a prepared step is pending; accept() or cancel_step() first")

    def _distinct(self, req_ids: Iterable[Hashable]) -> list[Entry]:
        req_ids = list(req_ids)
        if len(set(req_ids)) != len(req_ids):
            raise ValueError("a request is listed twice")
        return [self.entry(r) for r in req_ids]

    def _live_pages(self, e: Entry) -> int:
        """Pages holding the request's committed tokens (none when the model has no page roles)."""
        return pages_for(e.num_tokens, self.page_size) if self.page_roles else 0

    def _release(self, e: Entry) -> None:
        if e.slot >= 0:
            self.slot_pool.release([e.slot])
        self.page_pool.release(e.pages)
        if e.host_slot >= 0:
            self.host_tier.slot_pool.release([e.host_slot])
        self.host_tier.page_pool.release(e.host_pages)
        e.slot, e.pages, e.host_slot, e.host_pages = -1, [], -1, []
        self._batch = None

    def _zero_slots(self, slots: list[int]) -> None:
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        for m in self.states:
            m.on_context_start(self.state_tensors(m), idx)

    def _note_move(self, counter: str, n: int, bytes_counter: str, nbytes: int) -> None:
        self.stats[counter] += n
        self.stats[bytes_counter] += nbytes
        self._batch = None


__all__ = ["HybridCacheManager"]
