"""torch.argmax(logits, -1) as one Triton launch: one program a row walks its V columns BLOCK at a time, each lane
keeping its running maximum and the first column that holds it, then the lanes reduce once. In torch a batch-1
decode step's argmax over the 1B benchmark checkpoints' 32,000 fp32 logits (128 KB) is a reduction kernel of about
10 us on an H100 (benchmarks/step_profile.py `--by-module`); this one is untimed (ops/argmax.py).

The result is torch's: the first index of the maximum; a NaN counts as the maximum (the first NaN's index); a row
of -inf gives 0. Any float dtype; no host sync, graph-capturable.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .pdl_triton import pdl_entry, pdl_launch

BLOCK = 4096  # columns a step: 16 a thread at 8 warps
NUM_WARPS = 8


@triton.jit
def _argmax_kernel(x_ptr, out_ptr, V, stride_r, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """x [R, V] by its row stride (unit last) -> out [R] int64."""
    pdl_entry(PDL)
    row = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    at = lane  # a lane's first column of its maximum (its own first column while that is -inf)
    nan_at = tl.full([BLOCK], V, tl.int32)
    for c0 in range(0, V, BLOCK):
        c = c0 + lane
        x = tl.load(x_ptr + row * stride_r + c, mask=c < V, other=float("-inf")).to(tl.float32)
        nan_at = tl.minimum(nan_at, tl.where(x != x, c, V))
        better = x > best  # strictly: an earlier column keeps a tie
        at = tl.where(better, c, at)
        best = tl.where(better, x, best)
    first = tl.min(tl.where(best == tl.max(best, 0), at, V), 0)
    first_nan = tl.min(nan_at, 0)
    tl.store(out_ptr + row, tl.where(first_nan < V, first_nan, first).to(tl.int64))


def argmax_triton(logits: Tensor) -> Tensor:
    """logits [..., V] (V > 0) -> [...] int64, `logits.argmax(-1)`'s values."""
    V = logits.shape[-1]
    if V == 0:
        raise ValueError("argmax over an empty last dimension")
    rows = logits.reshape(-1, V) if logits.stride(-1) == 1 else logits.contiguous().reshape(-1, V)
    out = torch.empty(rows.shape[0], dtype=torch.int64, device=logits.device)
    if rows.shape[0]:
        _argmax_kernel[(rows.shape[0],)](rows, out, V, rows.stride(0), BLOCK=min(BLOCK, triton.next_power_of_2(V)),
                                         num_warps=NUM_WARPS, **pdl_launch(rows))
    return out.reshape(logits.shape[:-1])
