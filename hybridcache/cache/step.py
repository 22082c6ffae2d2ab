"""The opaque per-step indices the runner turns into kernel arguments."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepIndices:
    """Index tensors for one step of `B` rows (all on the device).

    slots        [B] int64  the slot of each row (dummies: their permanent slot)
    page_table   [B, max_pages] int32, -1 past a row's pages
    cached_lens  [B] int32  tokens already committed before this step
    num_new      [B] int32  tokens this step feeds per row
    fresh        [B] bool   the row starts from a zero state (its context begins now)
    generation   [B] bool   the row is a decode / verify row (its acceptance is recorded)
    """

    slots: torch.Tensor
    page_table: torch.Tensor
    cached_lens: torch.Tensor
    num_new: torch.Tensor
    fresh: torch.Tensor
    generation: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.slots.shape[0]


class StepBuilder:
    """Turns rows into `StepIndices`; keeps the last batch's page table and patches only changed rows."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._key: tuple | None = None
        self._table: torch.Tensor | None = None  # [B, width] int32, host copy of the page table
        self._widths: list[int] = []

    def invalidate(self) -> None:
        self._key = None

    def build(
        self,
        key: tuple,
        slots: list[int],
        pages: list[list[int]],
        cached: list[int],
        num_new: list[int],
        fresh: list[bool],
        generation: list[bool],
    ) -> StepIndices:
        table = self._page_table(key, pages)
        dev = self.device
        return StepIndices(
            slots=torch.tensor(slots, dtype=torch.long).to(dev, non_blocking=True),
            page_table=table.to(dev, non_blocking=True) if dev.type != "cpu" else table.clone(),
            cached_lens=torch.tensor(cached, dtype=torch.int32).to(dev, non_blocking=True),
            num_new=torch.tensor(num_new, dtype=torch.int32).to(dev, non_blocking=True),
            fresh=torch.tensor(fresh, dtype=torch.bool).to(dev, non_blocking=True),
            generation=torch.tensor(generation, dtype=torch.bool).to(dev, non_blocking=True),
        )

    def _page_table(self, key: tuple, pages: list[list[int]]) -> torch.Tensor:
        width = max((len(p) for p in pages), default=0)
        if self._key == key and self._table is not None and width <= self._table.shape[1]:
            table = self._table
            for row, (p, w) in enumerate(zip(pages, self._widths)):
                if len(p) != w:
                    table[row, w : len(p)] = torch.tensor(p[w:], dtype=torch.int32)
                    table[row, len(p) :] = -1
        else:
            width = max(width, 1) * 2  # headroom so growing rows do not force a rebuild
            table = torch.full((len(pages), width), -1, dtype=torch.int32)
            for row, p in enumerate(pages):
                if p:
                    table[row, : len(p)] = torch.tensor(p, dtype=torch.int32)
        self._key, self._table, self._widths = key, table, [len(p) for p in pages]
        return table
