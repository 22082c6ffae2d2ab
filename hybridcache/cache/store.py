"""`CacheStore`: the per-device half of the cache. Arenas, host records, copies, state hooks.

It executes the planner's plans and decides nothing. A store that raises part way leaves the planner to
undo its side (`cancel_move`, `abort_step`, `cancel_rebalance`); the store keeps every source intact
until the planner commits.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .copy_engine import CopyEngine
from .device_tier import DeviceTier
from .errors import StateLostError
from .host_tier import HostTier
from .plans import AcceptPlan, MovePlan, RecarvePlan, SnapshotPlan, StepPlan
from .protocol import StateModule
from .roles import RoleSpec
from .step import StepIndices, StepTensors


class CacheStore:
    def __init__(
        self, states: Sequence[StateModule], slot_roles: list[RoleSpec], page_roles: list[RoleSpec],
        device_bytes: int, num_slots: int, num_pages: int, host_slots: int, host_pages: int,
        device: torch.device,
    ) -> None:
        self.states = list(states)
        self.slot_roles, self.page_roles = slot_roles, page_roles
        self.device = device
        self.device_tier = DeviceTier(slot_roles, page_roles, device_bytes, device)
        self.device_tier.carve(num_slots, num_pages)
        self.host_tier = HostTier(slot_roles, page_roles, host_slots, host_pages, pin=device.type == "cuda")
        self.copies = CopyEngine(device)
        names = {f"{m.name}.{r}" for m in self.states for r in m.snapshot_roles()}
        self.snapshot_roles = [r for r in slot_roles if r.name in names]  # what a spilled snapshot keeps
        self._step = StepTensors(device)

    def state_tensors(self, module: StateModule | str) -> dict[str, torch.Tensor]:
        """Device role tensors `[layers, slots, ...]` of one state module, by local role name (rebuilt by
        a rebalance: read it, do not keep it across one)."""
        return self.device_tier.by_module[module if isinstance(module, str) else module.name]

    def page_tensors(self) -> dict[str, torch.Tensor]:
        """Device page role tensors `[layers, pages, ...]` by full role name (same caveat)."""
        return self.device_tier.pages

    # ------------------------------------------------------------------ steps
    def execute(self, plan: StepPlan) -> StepIndices:
        """Zero the plan's fresh slots, bring the index tensors up to date and order the compute stream
        after every copy; returns the step's index tensors."""
        if plan.fresh.any():
            self.zero_slots(plan.zero_slots)
        if plan.restore_ids:
            self.restore_snapshots(*plan.restore)
        if plan.page_copies[0].size:
            self.copy_pages(*plan.page_copies)
        indices = self._step.update(plan)
        self.copies.fence()
        return indices

    def accept(self, accept: AcceptPlan, chain: bool = False) -> None:
        """Each state module's bookkeeping after a verify step (PNAT, buffer flip, conv window); nothing
        to upload when no module keeps any (plain decode). `chain` (counts on the device, every row a
        verify row): the next step's committed lengths are taken from these (`StepTensors.chain`)."""
        if chain:
            self.chain(accept.num_valid)
        if accept.slots.size == 0 or not self.needs_accept:
            return
        slots = self._step.rows_on_device(accept.slots)
        n = accept.num_tokens  # one count for every row (a verify step): passed as an int, not uploaded
        tokens = int(n[0]) if n.size and (n == n[0]).all() else self._step.upload(n.astype(np.int32))
        valid = (accept.num_valid.to(torch.int32) if isinstance(accept.num_valid, torch.Tensor)  # still on the device
                 else self._step.upload(accept.num_valid.astype(np.int32)))
        self.accept_on_device(slots, tokens, valid)

    @property
    def needs_accept(self) -> bool:
        return any(m.needs_accept for m in self.states)

    def accept_on_device(self, slots: torch.Tensor, num_tokens: int | torch.Tensor, num_valid: torch.Tensor) -> None:
        """The modules' accept hooks on device tensors alone (no upload, no sync: a CUDA graph can hold it):
        slots [B] (-1: a padding row, untouched), num_tokens T or [B] int32, num_valid [B] int32 in 1..T."""
        for m in self.states:
            if m.needs_accept:
                m.on_accept(self.state_tensors(m), slots, num_tokens, num_valid)

    def chain(self, num_valid: torch.Tensor) -> None:
        """The step just executed commits `num_valid` [B] tokens a row, on the device: the next plan of the
        same rows with lengths on the device starts from them (`StepTensors.chain`)."""
        self._step.chain(num_valid if num_valid.dtype == torch.int32 else num_valid.to(torch.int32))

    def zero_slots(self, slots: np.ndarray | Sequence[int]) -> None:
        """Every role of `slots` from zero, through each module's context-start hook."""
        idx = self._step.upload(np.asarray(slots, dtype=np.int64))
        for m in self.states:
            m.on_context_start(self.state_tensors(m), idx)

    def restore_snapshots(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Zero request `slots` (every role), then copy the snapshots in slot `rows` into them."""
        self.zero_slots(slots)
        dst, src = self._step.upload(slots), self._step.upload(rows)
        for m in self.states:
            m.restore_snapshot(self.state_tensors(m), src, dst)

    def copy_pages(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Every page role of pages `dst` becomes a copy of pages `src` (device to device)."""
        s, d = self._step.upload(src), self._step.upload(dst)
        for t in self.device_tier.pages.values():
            t.index_copy_(1, d, t.index_select(1, s))

    def save_snapshots(self, plan: SnapshotPlan) -> None:
        """Each state module writes the committed state of the plan's request slots into its snapshot rows."""
        src = self._step.upload(np.asarray(plan.slots, dtype=np.int64))
        dst = self._step.upload(np.asarray(plan.rows, dtype=np.int64))
        for m in self.states:
            m.save_snapshot(self.state_tensors(m), src, dst)
        if plan.page_copies[0]:
            self.copy_pages(np.asarray(plan.page_copies[0], dtype=np.int64), np.asarray(plan.page_copies[1], dtype=np.int64))

    # ------------------------------------------------------------------ moves
    def copy(self, plan: MovePlan) -> int:
        """Copy the plan's live bytes from one tier to the other; returns the bytes moved. The source is
        not released here: the planner does that on commit."""
        host = self.host_tier
        roles = self.snapshot_roles if plan.snapshot else None
        if plan.to_host:
            return self._copy_out(host, plan.slots, plan.pages, plan.host_slots, plan.host_pages, roles)
        return self._copy_in(host, plan.slots, plan.pages, plan.host_slots, plan.host_pages, roles)

    def recarve(self, plan: RecarvePlan) -> int:
        """Move every live row to a carving of the plan's counts, through pinned host records (live bytes
        only); returns the bytes moved each way. On a failed copy back it re-carves the old split, copies
        the saved rows back to their old ids and re-raises; if even that fails it raises StateLostError.
        Whichever carving it leaves, the dummy rows are zeroed (a re-carve reinterprets their bytes)."""
        tier, copies = self.device_tier, self.copies
        n_slots, n_pages = len(plan.slots_from), len(plan.pages_from)
        saved = HostTier(self.slot_roles, self.page_roles, n_slots, n_pages, pin=copies.cuda)
        slot_rec, page_rec = tuple(range(n_slots)), tuple(range(n_pages))
        moved = self._copy_out(saved, plan.slots_from, plan.pages_from, slot_rec, page_rec)
        copies.synchronize()  # the old carving is read until here; nothing is changed yet
        tier.carve(plan.new_slots, plan.new_pages)
        try:
            self._copy_in(saved, plan.slots_to, plan.pages_to, slot_rec, page_rec)
            copies.synchronize()
        except BaseException as err:
            try:
                tier.carve(plan.old_slots, plan.old_pages)
                self._copy_in(saved, plan.slots_from, plan.pages_from, slot_rec, page_rec)
                copies.synchronize()
            except BaseException:
                raise StateLostError("rebalance failed and the old carving could not be restored") from err
            finally:
                self._zero_dummies(plan.num_dummies)
            raise
        self._zero_dummies(plan.num_dummies)
        self._step.invalidate()
        return moved

    def _zero_dummies(self, num_dummies: int) -> None:
        """Scratch rows: zeroed so a padding row never reads NaN bit patterns."""
        if num_dummies:
            self.device_tier.zero_slots(torch.arange(num_dummies, device=self.device))

    def synchronize(self) -> None:
        self.copies.synchronize()

    # ------------------------------------------------------------------ transfer between engines
    def read_records(self, slot: int, pages: Sequence[int]) -> HostTier:
        """The live bytes of device `slot` and `pages` in new (unpinned) host records, record i of
        `page_records` for `pages[i]`: the saved form a suspend writes."""
        rec = HostTier(self.slot_roles, self.page_roles, 1, len(pages), pin=False)
        self._copy_out(rec, [slot], list(pages), [0], list(range(len(pages))))
        self.copies.synchronize()
        return rec

    def write_host(self, host_slot: int, host_pages: Sequence[int], slot_record: torch.Tensor,
                   page_records: torch.Tensor) -> None:
        """Write a saved slot record `[slot nbytes]` and page records `[n, page nbytes]` (uint8) at host ids."""
        host = self.host_tier
        host.slot_records[host_slot].copy_(slot_record)
        if len(host_pages):
            host.page_records[torch.tensor(list(host_pages), dtype=torch.long)] = page_records

    def _copy_out(self, host: HostTier, slots, pages, host_slots, host_pages, roles=None) -> int:
        tier, copies = self.device_tier, self.copies
        return (copies.to_host(roles or self.slot_roles, tier.slots, list(slots), host.slot_layout, host.slot_records, list(host_slots))
                + copies.to_host(self.page_roles, tier.pages, list(pages), host.page_layout, host.page_records, list(host_pages)))

    def _copy_in(self, host: HostTier, slots, pages, host_slots, host_pages, roles=None) -> int:
        tier, copies = self.device_tier, self.copies
        return (copies.to_device(roles or self.slot_roles, tier.slots, list(slots), host.slot_layout, host.slot_records, list(host_slots))
                + copies.to_device(self.page_roles, tier.pages, list(pages), host.page_layout, host.page_records, list(host_pages)))

