"""Step indices for the runner, and the persistent batch that keeps them between steps."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .entries import Entry, Status


@dataclass(frozen=True)
class StepIndices:
    """Index tensors for one step of `B` rows, on the device; valid until the next `prepare_step`.

    slots        [B] int64  the slot of each row (dummies: their permanent slot)
    page_table   [B, max_pages] int32, -1 past a row's pages
    cached_lens  [B] int32  tokens already committed before this step
    num_new      [B] int32  tokens this step feeds per row
    fresh        [B] bool   the row starts from a zero state (its context begins now)
    generation   [B] bool   the row is a decode / verify row (its acceptance is recorded)
    host_cached_lens, host_num_new  [B] int64 numpy: the same counts on the host, so that token
                 offsets and positions can be laid out without reading the device back
    """

    slots: torch.Tensor
    page_table: torch.Tensor
    cached_lens: torch.Tensor
    num_new: torch.Tensor
    fresh: torch.Tensor
    generation: torch.Tensor
    host_cached_lens: np.ndarray
    host_num_new: np.ndarray

    @property
    def batch_size(self) -> int:
        return self.slots.shape[0]


class Batch:
    """The rows of the last step with their index tensors kept between steps.

    While the same rows come back (the common decode case) only what changed is written: the page
    table entries of rows that crossed a page boundary and the cached lengths.
    """

    def __init__(self, key: tuple, entries: list[Entry], device: torch.device) -> None:
        self.key = key
        self.entries = entries
        self.device = device
        self.handles = np.array([e.handle for e in entries], dtype=np.int64)
        self.dummy = np.array([e.status == Status.DUMMY for e in entries], dtype=bool)
        self.npages = np.array([len(e.pages) for e in entries], dtype=np.int64)
        self.gen_rows = [i for i, e in enumerate(entries) if e.status == Status.GENERATION]
        self.waiting_rows = [i for i, e in enumerate(entries) if e.status == Status.WAITING]  # emptied once served
        self.gen_mask = np.zeros(len(entries), dtype=bool)
        self.gen_mask[self.gen_rows] = True
        width = max(2 * int(self.npages.max(initial=0)), 1)
        self.table = np.full((len(entries), width), -1, dtype=np.int32)  # host copy; the device one mirrors it
        for i, e in enumerate(entries):
            self.table[i, : len(e.pages)] = e.pages
        self.dev_table = self._dev(torch.from_numpy(self.table))
        self.slots = self._dev(torch.tensor([e.slot for e in entries], dtype=torch.long))
        self.generation = self._dev(torch.from_numpy(self.gen_mask.copy()))
        self.gen_slots = self._dev(torch.tensor([entries[i].slot for i in self.gen_rows], dtype=torch.long))
        self._num_new_key: object = None
        self._num_new: torch.Tensor | None = None
        self._no_fresh = self._dev(torch.zeros(len(entries), dtype=torch.bool))

    def _dev(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True) if self.device.type != "cpu" else t

    def set_slot(self, row: int, slot: int) -> None:
        self.slots[row] = slot

    def add_pages(self, rows: list[int], pages: list[list[int]]) -> None:
        """Append `pages[i]` to the page-table row `rows[i]`; only those entries are written."""
        counts = np.array([len(p) for p in pages], dtype=np.int64)
        starts = self.npages[rows]
        if int((starts + counts).max()) > self.table.shape[1]:
            grown = np.full((self.table.shape[0], 2 * int((starts + counts).max())), -1, dtype=np.int32)
            grown[:, : self.table.shape[1]] = self.table
            self.table = grown
            self.dev_table = self._dev(torch.from_numpy(grown))
        r = np.repeat(np.asarray(rows, dtype=np.int64), counts)
        c = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, counts)])
        v = np.fromiter((p for ps in pages for p in ps), dtype=np.int32, count=int(counts.sum()))
        self.table[r, c] = v
        if self.device.type != "cpu":
            self.dev_table[torch.from_numpy(r).to(self.device), torch.from_numpy(c).to(self.device)] = (
                torch.from_numpy(v).to(self.device)
            )
        self.npages[rows] = starts + counts

    def num_new_tensor(self, num_new: np.ndarray, key: object) -> torch.Tensor:
        if key is None or key != self._num_new_key or self._num_new is None:
            self._num_new = self._dev(torch.from_numpy(num_new.astype(np.int32)))
            self._num_new_key = key
        return self._num_new

    def indices(self, cached: np.ndarray, n: np.ndarray, num_new: torch.Tensor, fresh_rows: list[int]) -> StepIndices:
        if fresh_rows:
            fresh = torch.zeros(len(self.entries), dtype=torch.bool)
            fresh[fresh_rows] = True
            fresh = self._dev(fresh)
        else:
            fresh = self._no_fresh
        return StepIndices(
            slots=self.slots,
            page_table=self.dev_table,
            cached_lens=self._dev(torch.from_numpy(cached.astype(np.int32))),
            num_new=num_new,
            fresh=fresh,
            generation=self.generation,
            host_cached_lens=cached,
            host_num_new=n,
        )
