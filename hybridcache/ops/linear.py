"""The model's GEMMs `x @ weight.T (+ bias)` (torch's GEMM: cuBLAS on CUDA), with the activation that follows
where one does, in its own launch where Triton runs.

Epilogues: "none"; "relu2", relu(y)²; "silu_mul", silu(y[:, :inner]) * y[:, inner:2·inner] of one gate/up
GEMM. A one-launch skinny Triton GEMM with these epilogues (and the mixers' conv update) lost to cuBLAS in
the engine on an H100 (nemotron_h 1b graph step 1.13 vs 1.02 ms at batch 1, 1.85 vs 1.35 ms at batch 16) and
was removed; it is in the history at commits 42922fe and b7b5b70.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .triton_support import runs_triton


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, epilogue: str = "none",
           inner: int | None = None) -> Tensor:
    """x [M, K], weight [N, K], bias [N] or None -> [M, N] ("none", "relu2") or [M, inner] ("silu_mul", no bias)."""
    y = F.linear(x, weight, bias)
    if epilogue == "relu2":
        return relu2(y)
    if epilogue == "silu_mul":
        return silu_mul(y, inner)
    return y


def relu2(x: Tensor) -> Tensor:
    """relu(x)², one launch where Triton runs (`activation_triton.relu2_triton`, the same values)."""
    if runs_triton(x) and x.is_contiguous():
        from .activation_triton import relu2_triton

        return relu2_triton(x)
    return torch.square(F.relu(x))


def silu_mul(h: Tensor, inner: int) -> Tensor:
    """silu(h[:, :inner]) * h[:, inner:2·inner], one launch where Triton runs (`activation_triton.silu_mul_triton`)."""
    if runs_triton(h):
        from .activation_triton import silu_mul_triton

        return silu_mul_triton(h, inner)
    return F.silu(h[:, :inner]) * h[:, inner : 2 * inner]
