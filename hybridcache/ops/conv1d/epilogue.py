"""The conv update a one-row GEMM can apply to its own output (`gemv_triton`'s conv epilogue)."""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class ConvEpilogue(NamedTuple):
    """A causal conv update (`causal_conv1d_update`, one token) on a one-row GEMM's output columns start ..
    start + C: taps weight [C, WIDTH], bias [C] or None, the conv role [S, C, W + k] (W = WIDTH - 1; its windows
    written in place), slots [1] (negative: a padding row), silu or no activation."""
    start: int
    weight: Tensor
    bias: Tensor | None
    conv: Tensor
    slots: Tensor
    silu: bool = True
