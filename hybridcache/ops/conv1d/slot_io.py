"""Reading and writing per-slot rows of a role without a host sync.

Rows whose slot is negative are padding: `take_rows` gives them zeros and `put_rows` writes nothing for
them. Dropping rows would need a data-dependent shape (a sync), so `put_rows` points every padding row at
the target of the first valid row, lets one index_put write all rows (the padding rows may scribble on
that one target), then rewrites that target with the value it must end with: the first valid row's
values, or its own earlier content when no row is valid.
"""

from __future__ import annotations

import torch
from torch import Tensor


def take_rows(src: Tensor, slots: Tensor, valid: Tensor | None = None) -> Tensor:
    """`src[slots]` with zeros where `valid` is false (default: `slots >= 0`).

    src: [S, *R]; slots: [B] int64; valid: [B] bool. Returns [B, *R] (a copy).
    """
    if valid is None:
        valid = slots >= 0
    rows = src[slots.clamp_min(0)]
    return rows.masked_fill_(~valid.view(-1, *([1] * (rows.ndim - 1))), 0)


def put_rows(dst: Tensor, index: tuple[Tensor, ...], values: Tensor, valid: Tensor) -> None:
    """`dst[index] = values` for the rows where `valid` is true; other rows write nothing.

    dst: any tensor (a view is fine, it is written in place). index: advanced indices over dst's leading
    dims, each [B, *E] (per row) or [1, *E] (shared by all rows); values: [B, *E, *R] matching
    `dst[index]`; valid: [B] bool. Rows of one call must not share targets (a slot has one owner).
    """
    batch = valid.shape[0]
    first = valid.to(torch.int32).argmax().view(1)  # first valid row, 0 when none is valid (no sync)

    def pick(t: Tensor) -> Tensor:
        """Row `first` of a per-row tensor, kept as a leading dim of 1."""
        return t.index_select(0, first) if t.shape[0] == batch else t[:1]

    redirected = []
    for idx in index:
        if idx.shape[0] == batch:
            mask = valid.view(-1, *([1] * (idx.ndim - 1)))
            idx = torch.where(mask, idx, pick(idx))
        redirected.append(idx.clamp_min(0))
    first_index = tuple(pick(i) for i in redirected)  # each [1, *E]
    keep_valid = pick(valid).view(-1, *([1] * (values.ndim - 1)))
    keep = torch.where(keep_valid, pick(values).to(dst.dtype), dst[first_index])  # read before writing
    dst.index_put_(tuple(redirected), values.to(dst.dtype))
    dst.index_put_(first_index, keep)
