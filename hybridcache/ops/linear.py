"""The model's GEMMs `x @ weight.T (+ bias)`, with the activation that follows where one does.

With the skinny kernel on (`SKINNY`, the environment's HYBRIDCACHE_SKINNY_GEMM=1) a decode-sized x (at most
`skinny_linear_triton.MAX_ROWS` rows) where Triton runs takes one launch for the GEMM and its activation
(`skinny_linear_triton`); otherwise torch's GEMM (cuBLAS), then the activation's own launch. Off by default
until its timing on the H200 against cuBLAS decides (`benchmarks/ops_linear.py`).

Epilogues: "none"; "relu2", relu(y)²; "silu_mul", silu(y[:, :inner]) * y[:, inner:2·inner] of one gate/up
GEMM (rows past 2·inner not computed on the skinny path). The two paths round where the unfused ops round.
On the skinny path only, a recurrent mixer's causal conv update over its conv columns (`ConvEpilogue`): the
in-projection and the conv one launch.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .triton_support import runs_triton

SKINNY = os.environ.get("HYBRIDCACHE_SKINNY_GEMM", "0") == "1"
SKINNY_MAX_ROWS = 16  # skinny_linear_triton.MAX_ROWS (kept here: that module imports triton)


class ConvEpilogue(NamedTuple):
    """A causal depthwise conv over output columns `first .. first + C` of a skinny GEMM, as
    `conv1d.causal_conv1d_update(y[:, first:first + C].view(B, T, C), weight, bias, state, slots, "silu" if
    silu)` would run it, windows updated in place; y's rows are B = len(slots) batch rows of T tokens."""
    weight: Tensor  # [C, W + 1]
    bias: Tensor | None  # [C]
    state: Tensor  # [S, C, >= W + T - 1], any strides
    slots: Tensor  # [B] (negative: padding)
    first: int
    silu: bool


def takes_skinny(x: Tensor, weight: Tensor) -> bool:
    """Whether `linear` runs x against weight in the skinny kernel."""
    return (SKINNY and runs_triton(x) and x.dim() == 2 and x.shape[0] <= SKINNY_MAX_ROWS and x.dtype == weight.dtype
            and x.stride(-1) == 1 and weight.stride(-1) == 1)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, epilogue: str = "none",
           inner: int | None = None, conv: ConvEpilogue | None = None) -> Tensor:
    """x [M, K], weight [N, K], bias [N] or None -> [M, N] ("none", "relu2") or [M, inner] ("silu_mul", no bias).
    `conv`: only where `takes_skinny` (the caller runs the conv itself otherwise)."""
    if takes_skinny(x, weight):
        from .skinny_linear_triton import skinny_linear_triton

        return skinny_linear_triton(x, weight, bias, epilogue, inner, conv=conv)
    if conv is not None:
        raise ValueError("a conv epilogue runs in the skinny kernel only (takes_skinny)")
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
