"""Column- and row-parallel linears, weights `[out, in]` as checkpoints store them.

Column-parallel: this rank computes the output columns of its `ranges` of the out dim (the input is whole).
Row-parallel: this rank reads the input columns of its `ranges` and returns a partial sum; the caller sums
the ranks' partials with one all-reduce (`TPGroup.all_reduce`), and the bias is added on rank 0 only so
the sum holds it once.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..ops.linear import linear

from .group import TPGroup
from .shard import shard


def _param(*shape: int, device: torch.device | str, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """weight `[sum of range lengths, d_in]` (rows `ranges` of the checkpoint's `[full_out, d_in]`), bias alike."""

    def __init__(self, d_in: int, full_out: int, ranges: Sequence[tuple[int, int]], bias: bool,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        out = sum(n for _, n in ranges)
        self.weight = shard(_param(out, d_in, device=device, dtype=dtype), 0, full_out, *ranges)
        self.bias = shard(_param(out, device=device, dtype=dtype), 0, full_out, *ranges) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, d_in] -> [N, local out]."""
        return linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """weight `[d_out, sum of range lengths]` (columns `ranges` of the checkpoint's `[d_out, full_in]`);
    the bias lives on rank 0 only (other ranks have none, and load none)."""

    def __init__(self, full_in: int, ranges: Sequence[tuple[int, int]], d_out: int, bias: bool, tp: TPGroup,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        d_in = sum(n for _, n in ranges)
        self.weight = shard(_param(d_out, d_in, device=device, dtype=dtype), 1, full_in, *ranges)
        self.bias = _param(d_out, device=device, dtype=dtype) if bias and tp.rank == 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, local in] -> [N, d_out], this rank's partial sum (all of it for one rank)."""
        return linear(x, self.weight, self.bias)
