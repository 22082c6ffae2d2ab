"""Reading and writing per-slot rows of a role without a host sync.

Rows whose slot is negative are padding: `take_rows` gives them zeros and a write leaves nothing of them.
Dropping rows would need a data-dependent shape (a sync), so a write points every padding row at the
targets of the first valid row, lets one `index_put_` write all rows (the padding rows may scribble on
those targets), then rewrites them with the value they must end with: the first valid row's values, or
their own earlier content when no row is valid.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .triton_support import runs_triton


def take_rows(src: Tensor, slots: Tensor, valid: Tensor | None = None) -> Tensor:
    """`src[slots]` with zeros where `valid` is false (default: `slots >= 0`).

    src: [S, *R]; slots: [B] int64; valid: [B] bool. Returns [B, *R] (a copy).
    """
    if valid is None:
        valid = slots >= 0
    rows = src[slots.clamp_min(0)]
    return rows.masked_fill_(~valid.view(-1, *([1] * (rows.ndim - 1))), 0)


def read_rows(src: Tensor, slots: Tensor, has_initial: Tensor | None = None) -> Tensor:
    """`take_rows` in fp32 for a state role: rows that are padding or have `has_initial` [B] false read zeros.

    The mask is a fill, not a product, so stale NaNs in unused slots never leak. On CUDA, a contiguous
    pool is read in one launch (`slot_rows_triton`)."""
    if runs_triton(src):
        from .slot_rows_triton import read_rows_triton, rows_fit

        if rows_fit(src, slots):
            return read_rows_triton(src, slots, has_initial)
    valid = slots >= 0
    if has_initial is not None:
        valid = valid & has_initial.to(valid.device)
    return take_rows(src, slots, valid).float()


class RowScatter:
    """One batch's write pattern, reusable for several roles indexed the same way.

    index: advanced indices over a destination's leading dims, each [B, *E] (per row) or [1, *E] (shared
    by all rows); valid: [B] bool. Rows of one batch must not share targets (a slot has one owner).
    """

    def __init__(self, index: tuple[Tensor, ...], valid: Tensor) -> None:
        batch = valid.shape[0]
        self._batch = batch
        if batch == 0:  # nothing to write: `put` returns at once
            return
        self._first = valid.to(torch.int32).argmax().view(1)  # first valid row, 0 when none is valid (no sync)
        redirected = []
        for idx in index:
            if idx.shape[0] == batch:
                mask = valid.view(-1, *([1] * (idx.ndim - 1)))
                idx = torch.where(mask, idx, self._pick(idx))
            redirected.append(idx.clamp_min(0))
        self.index = tuple(redirected)
        self.first_index = tuple(self._pick(i) for i in redirected)  # each [1, *E]
        self.first_valid = self._pick(valid)  # [1]

    def _pick(self, t: Tensor) -> Tensor:
        """Row `first` of a per-row tensor, kept as a leading dim of 1."""
        return t.index_select(0, self._first) if t.shape[0] == self._batch else t[:1]

    def put(self, dst: Tensor, values: Tensor) -> None:
        """`dst[index] = values` for the valid rows, in place (a view is fine); values: [B, *E, *R]."""
        if self._batch == 0:
            return
        keep_valid = self.first_valid.view(-1, *([1] * (values.ndim - 1)))
        keep = torch.where(keep_valid, self._pick(values).to(dst.dtype), dst[self.first_index])  # read first
        dst.index_put_(self.index, values.to(dst.dtype))
        dst.index_put_(self.first_index, keep)


def put_rows(dst: Tensor, index: tuple[Tensor, ...], values: Tensor, valid: Tensor) -> None:
    """`dst[index] = values` for the rows where `valid` is true; other rows write nothing.

    dst: any tensor (a view is fine, it is written in place). index: advanced indices over dst's leading
    dims, each [B, *E] (per row) or [1, *E] (shared by all rows); values: [B, *E, *R] matching
    `dst[index]`; valid: [B] bool. Rows of one call must not share targets (a slot has one owner).
    On CUDA, rows of a contiguous pool indexed by slot alone are written in one launch (`slot_rows_triton`).
    """
    if len(index) == 1 and index[0].shape == valid.shape and runs_triton(dst):
        from .slot_rows_triton import rows_fit, write_rows_triton

        if rows_fit(dst, index[0], values):
            write_rows_triton(dst, index[0], values, valid)
            return
    RowScatter(index, valid).put(dst, values)
