"""Builds the model's `ForwardBatch` from a step's index tensors and the store's role tensors."""
from __future__ import annotations

import numpy as np
import torch

from ..cache import CacheStore, StepIndices
from ..models.batch import ForwardBatch
from ..ops.attention import HostRows


def forward_batch(
    store: CacheStore,
    step: StepIndices,
    num_context_rows: int,
    generation_tokens: int,
    speculative: bool,
    pages_checked: bool = False,
    with_positions: bool = True,
) -> ForwardBatch:
    """Rows of `step` must be ordered context rows first; generation rows feed `generation_tokens` each.
    `pages_checked`: the plan behind `step` was checked on the host to give every row pages for all its
    tokens, so the attention ops skip their device-side check (a host sync per layer).
    `with_positions=False`: none uploaded (a graph step of generation rows computes them from `cached_lens`;
    so does a step whose lengths live on the device, `StepIndices.lens_on_device`)."""
    n, cached = step.host_num_new, step.host_cached_lens
    cu = np.zeros(len(n) + 1, dtype=np.int64)
    np.cumsum(n, out=cu[1:])
    device = step.slots.device
    positions = None
    host_rows = HostRows(cached, n, pages_checked)
    if step.lens_on_device:  # the host holds upper bounds only: lengths and positions from the device
        with_positions = False
        host_rows = HostRows(None, None, pages_checked, uniform_new=generation_tokens)
    if with_positions:
        starts = np.repeat(cu[:-1], n)  # laid out on the host: the counts are known there, no read-back
        positions = torch.from_numpy(np.repeat(cached, n) + np.arange(cu[-1]) - starts).to(device, non_blocking=True)
    return ForwardBatch(
        positions=positions,
        cu_seqlens=step.cu_seqlens,
        cached_lens=step.cached_lens,
        slots=step.slots,
        has_initial=step.has_initial,
        page_table=step.page_table,
        num_context_rows=num_context_rows,
        num_context_tokens=int(cu[num_context_rows]),
        generation_tokens=generation_tokens,
        states={m.name: store.state_tensors(m) for m in store.states},
        pages=store.page_tensors(),
        speculative=speculative,
        host_rows=host_rows,
    )


def generation_positions(cached_lens: torch.Tensor, tokens_per_row: int) -> torch.Tensor:
    """Positions [B * T] int64 of generation rows that feed T tokens each, on the device: row b's are
    cached_lens[b] + 0 .. T - 1. Inside a step's CUDA graph each op is a launch: at T = 1 only the cast (a
    decode step), otherwise the cast, the offsets and their sum."""
    if tokens_per_row == 1:
        return cached_lens.to(torch.int64, copy=True)
    offsets = torch.arange(tokens_per_row, device=cached_lens.device)
    return (cached_lens.long()[:, None] + offsets).flatten()
