"""relu(x)² in one launch (torch spends two: relu, then square), for nemotron_h's MLP.

The square is computed in fp32 from the input's value and rounded once to its dtype (`_round`, to
nearest even on the GPU and in the interpreter alike), which is what torch's square of a relu'd bf16
tensor gives: relu is exact, and torch squares in fp32 and rounds once. Contiguous input; no host sync.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rms_norm_triton import _round

BLOCK = 2048


@triton.jit
def _relu2_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = at < n
    v = tl.maximum(tl.load(x_ptr + at, mask=inside, other=0.0).to(tl.float32), 0.0)
    out = _round(v * v, y_ptr.dtype.element_ty)
    tl.store(y_ptr + at, out.to(y_ptr.dtype.element_ty), mask=inside)


def relu2_triton(x: torch.Tensor) -> torch.Tensor:
    """`torch.square(F.relu(x))` for a contiguous x of any shape; returns a new tensor of x's dtype."""
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _relu2_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK)
    return y
