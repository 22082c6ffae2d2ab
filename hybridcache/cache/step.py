"""Step index tensors on the device, and the persistent copies that a repeated batch only updates."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .plans import StepPlan


@dataclass(frozen=True)
class StepIndices:
    """Index tensors for one step of `B` rows, on the device; valid until the next executed plan.

    slots        [B] int64  the slot of each row (dummies: their permanent slot)
    page_table   [B, max_pages] int32, -1 past a row's pages
    cached_lens  [B] int32  tokens already committed before this step
    num_new      [B] int32  tokens this step feeds per row
    fresh        [B] bool   the row starts from a zero state (its context begins now)
    has_initial  [B] bool   ~fresh
    cu_seqlens   [B + 1] int32  offsets of the rows' tokens (the running sum of num_new)
    generation   [B] bool   the row is a decode / verify row (its acceptance is recorded)
    host_cached_lens, host_num_new  [B] int64 numpy: the same counts on the host, so that token
                 offsets and positions can be laid out without reading the device back
    lens_on_device  host_cached_lens is only an upper bound (the plan's `lens_on_device`): positions and
                 row lengths must come from the device tensors
    """

    slots: torch.Tensor
    page_table: torch.Tensor
    cached_lens: torch.Tensor
    num_new: torch.Tensor
    fresh: torch.Tensor
    has_initial: torch.Tensor
    cu_seqlens: torch.Tensor
    generation: torch.Tensor
    host_cached_lens: np.ndarray
    host_num_new: np.ndarray
    lens_on_device: bool = False

    @property
    def batch_size(self) -> int:
        return self.slots.shape[0]


class StepTensors:
    """The device side of the planner's layout: rebuilt when a plan's `version` changes, otherwise only
    the page-table entries the plan writes and the per-step counts are uploaded. Tensors that a steady
    batch repeats (slots, the page table, num_new and its offsets, an all-true has_initial) stay the same
    objects until their content changes, so a graph step need not copy them again (`engine.graphs`); none
    is written in place (a page-table write makes a new table). Committed lengths that are the step
    before's plus its tokens (a steady decode step) are added on the device, not uploaded."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._version = -1
        self._num_new_key: bytes | None = None
        # the step before's row ends: on the host, and as its cached_lens and num_new on the device
        self._ends: tuple[np.ndarray, torch.Tensor, torch.Tensor] | None = None
        self._accepted: torch.Tensor | None = None  # `chain`: the last step's accepted counts, on the device

    def invalidate(self) -> None:
        self._version = -1

    def upload(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.array(a, copy=True, order="C"))  # plans are read-only and outlive the step
        return t.to(self.device, non_blocking=True) if self.device.type != "cpu" else t

    def rows_on_device(self, slots: np.ndarray) -> torch.Tensor:
        """`slots` on the device: the last step's own slot tensor when they are its rows (a verify step's
        accept), else uploaded."""
        if self._version >= 0 and np.array_equal(slots, self._host_slots):
            return self.slots
        return self.upload(slots)

    def chain(self, accepted: torch.Tensor) -> None:
        """The step just executed commits `accepted` [B] tokens per row, known on the device only: a next
        plan with `lens_on_device` (the same rows) takes its committed lengths as that step's plus these."""
        self._accepted = accepted

    def update(self, plan: StepPlan) -> StepIndices:
        chained = None
        if plan.lens_on_device:  # before any rebuild: the same rows in the same order, maybe a new layout
            if self._ends is None or self._accepted is None or len(self._ends[0]) != plan.batch_size:
                raise RuntimeError("a plan with lengths on the device follows no chained step of its rows")
            chained = self._ends[1] + self._accepted
        self._accepted = None
        if plan.version != self._version:
            b = plan.batch_size
            self._version = plan.version
            self.slots = self.upload(plan.slots)
            self._host_slots = plan.slots
            self.generation = self.upload(plan.generation)
            self.table = torch.full((b, plan.table_width), -1, dtype=torch.int32, device=self.device)
            self._table_out = False  # handed out in a StepIndices: written from then on only as a copy
            self.no_fresh = torch.zeros(b, dtype=torch.bool, device=self.device)
            self.all_initial = torch.ones(b, dtype=torch.bool, device=self.device)
            self._num_new_key = None
            self._ends = None
        if plan.table_width > self.table.shape[1]:
            grown = torch.full((self.table.shape[0], plan.table_width), -1, dtype=torch.int32, device=self.device)
            grown[:, : self.table.shape[1]] = self.table
            self.table, self._table_out = grown, False
        rows, cols, pages = plan.table_writes
        if rows.size:
            if self._table_out:
                self.table, self._table_out = self.table.clone(), False
            self.table[self.upload(rows), self.upload(cols)] = self.upload(pages.astype(np.int32))
        cached_lens = chained if chained is not None else self._cached_lens(plan)
        key = plan.num_new.tobytes()
        if key != self._num_new_key:
            self.num_new = self.upload(plan.num_new.astype(np.int32))
            cu = np.zeros(len(plan.num_new) + 1, dtype=np.int32)
            np.cumsum(plan.num_new, out=cu[1:])
            self.cu_seqlens = self.upload(cu)
            self._num_new_key = key
        if plan.fresh.any():
            fresh = self.upload(plan.fresh)
            has_initial = ~fresh
        else:
            fresh, has_initial = self.no_fresh, self.all_initial
        self._ends = (plan.cached_lens + plan.num_new, cached_lens, self.num_new)
        self._table_out = True
        return StepIndices(
            slots=self.slots, page_table=self.table, cached_lens=cached_lens,
            num_new=self.num_new, fresh=fresh, has_initial=has_initial, cu_seqlens=self.cu_seqlens,
            generation=self.generation,
            host_cached_lens=plan.cached_lens, host_num_new=plan.num_new, lens_on_device=plan.lens_on_device,
        )

    def _cached_lens(self, plan: StepPlan) -> torch.Tensor:
        """The plan's committed lengths on the device [B] int32: the step before's ends when they match (one
        add on the device), else uploaded."""
        ends = self._ends
        if ends is not None and np.array_equal(plan.cached_lens, ends[0]):
            return ends[1] + ends[2]
        return self.upload(plan.cached_lens.astype(np.int32))
