"""Index arithmetic and argument checks shared by the paged attention ops.

Layout (docs/layouts.md): token ``t`` of row ``b`` lives at page ``page_table[b, t // page_size]``,
offset ``t % page_size``; ``page_table`` is int32 with -1 past the row's last page. A step's new tokens
are flat (``[N, ...]``), row ``b`` owning ``[cu_seqlens[b], cu_seqlens[b + 1])``, and they take the
positions ``cached_lens[b] + i``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

# The page of a token that has none, when the table is not checked: past every pool (page ids are int32),
# so that a write there fails loudly (IndexError on the host, a device assert on CUDA), never lands in a page.
NO_PAGE = torch.iinfo(torch.int32).max


class PageTableError(ValueError):
    """A new token would land outside the pages its row holds (page -1 or past the table's width)."""


@dataclass(frozen=True)
class HostRows:
    """What the caller already knows on the host about a step's rows, so that the ops need not read it back.

    cached_lens, num_new: [B] int numpy, equal to the device's ``cached_lens`` and the row lengths of
    ``cu_seqlens`` (None: not known on the host, e.g. inside a CUDA graph that replays other lengths).
    pages_checked: the caller has checked on the host that every row's pages cover its positions
    ``[0, cached_lens + num_new)``; the ops then skip their device-side PageTableError check.
    uniform_new: with the lengths unknown, every row feeds this many tokens: the ops then size their
    work from the page table's width instead of reading the lengths back (static shapes, graph-capturable).
    """

    cached_lens: np.ndarray | None
    num_new: np.ndarray | None
    pages_checked: bool = False
    uniform_new: int | None = None  # every row feeds this many tokens (a decode / verify step)

    def __post_init__(self) -> None:
        if (self.cached_lens is None) != (self.num_new is None):
            raise ValueError("cached_lens and num_new are both known on the host or both not")
        if self.cached_lens is not None and (self.cached_lens.shape != self.num_new.shape or self.cached_lens.ndim != 1):
            raise ValueError(f"cached_lens {self.cached_lens.shape} and num_new {self.num_new.shape} must both be [B]")


def check_rows(page_table: Tensor, cached_lens: Tensor, cu_seqlens: Tensor, num_tokens: int) -> None:
    """Shape and dtype checks that need no device sync.

    page_table: [B, max_pages] int; cached_lens: [B] int; cu_seqlens: [B + 1] int.
    """
    if page_table.ndim != 2:
        raise ValueError(f"page_table must be [B, max_pages], got shape {tuple(page_table.shape)}")
    batch = page_table.shape[0]
    if tuple(cached_lens.shape) != (batch,):
        raise ValueError(f"cached_lens must be [{batch}], got shape {tuple(cached_lens.shape)}")
    if tuple(cu_seqlens.shape) != (batch + 1,):
        raise ValueError(f"cu_seqlens must be [{batch + 1}], got shape {tuple(cu_seqlens.shape)}")
    for name, t in (("page_table", page_table), ("cached_lens", cached_lens), ("cu_seqlens", cu_seqlens)):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
    if num_tokens < 0:
        raise ValueError(f"negative token count {num_tokens}")


def new_token_positions(cached_lens: Tensor, cu_seqlens: Tensor, num_tokens: int) -> tuple[Tensor, Tensor]:
    """Row and absolute position of each new token.

    Returns ``rows [N]`` (int64) and ``pos [N]`` (int64): token ``n`` is the ``n - cu_seqlens[rows[n]]``-th
    new token of its row, at position ``cached_lens[rows[n]] + n - cu_seqlens[rows[n]]``.
    """
    device = cu_seqlens.device
    cu = cu_seqlens.long()
    counts = cu[1:] - cu[:-1]
    batch = counts.shape[0]
    rows = torch.repeat_interleave(torch.arange(batch, device=device), counts, output_size=num_tokens)
    local = torch.arange(num_tokens, device=device) - cu[rows]
    return rows, cached_lens.long()[rows] + local


def token_slots(page_table: Tensor, rows: Tensor, pos: Tensor, page_size: int,
                check: bool = True) -> tuple[Tensor, Tensor]:
    """Page and offset of each token; raises PageTableError if one falls outside its row's pages.

    rows, pos: [N] int64. Returns ``pages [N]`` and ``offsets [N]`` (int64).
    check=False skips the check (a host sync) for a table the caller validated on the host: a token with
    no page then gets page NO_PAGE, so that writing it fails instead of corrupting a page.
    """
    col = pos // page_size
    width = page_table.shape[1]
    in_table = col < width
    pages = page_table[rows, col.clamp(max=max(width - 1, 0))].long() if width else torch.full_like(col, -1)
    pages = torch.where(in_table, pages, -1)
    bad = pages < 0
    if not check:
        return torch.where(bad, NO_PAGE, pages), pos % page_size
    if pos.numel() and bool(bad.any()):
        n = int(bad.nonzero()[0, 0])
        raise PageTableError(
            f"new token {n} of row {int(rows[n])} at position {int(pos[n])} has no page "
            f"(page_table column {int(col[n])} is {'past the table' if not bool(in_table[n]) else '-1'})"
        )
    return pages, pos % page_size


def row_pages(page_table: Tensor, rows: Tensor, num_pages: int) -> Tensor:
    """The first ``num_pages`` page ids of the given rows, -1 (and columns past the table) mapped to 0.

    Returns ``[len(rows), num_pages]`` int64. Callers must mask the positions past each row's length:
    page 0 belongs to someone else.
    """
    width = page_table.shape[1]
    table = page_table.index_select(0, rows)[:, : min(num_pages, width)].long().clamp(min=0)
    if num_pages > width:
        table = torch.nn.functional.pad(table, (0, num_pages - width))
    return table


def copy_into_slots(pool: Tensor, slots: Tensor, values: Tensor) -> None:
    """Write ``values[n]`` at flat index ``slots[n]`` of the pool's leading dims, in place.

    pool: [*lead, *tail]; values: [N, *tail]; slots: [N] int64 in [0, prod(lead)); a slot past the end
    raises (IndexError on the host, a device assert on CUDA) and is never wrapped into the pool.
    A flat ``index_copy_`` is far faster on CPU than a multi-index ``index_put_`` (0.02 ms vs 12 ms
    for 64 tokens into a 537 MB pool).
    """
    tail = values.shape[1:]
    lead = pool.shape[: pool.ndim - len(tail)]
    if pool.is_contiguous():
        pool.view(-1, *tail).index_copy_(0, slots, values.to(pool.dtype))
    else:
        # unravel_index wraps every coordinate, the first too: leave that one unbounded, so a slot past
        # the pool fails the bounds check of index_put_
        inner = math.prod(lead[1:])
        rest = torch.unravel_index(slots % inner, lead[1:]) if len(lead) > 1 else ()
        pool.index_put_((slots // inner, *rest), values.to(pool.dtype))
