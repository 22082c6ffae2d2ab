"""Non-gated MLP `down(act(up(x)))` and the activations checkpoints name."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.linear import linear, relu2
from ...parallel import SINGLE, TPGroup, head_share
from ...parallel.linear import ColumnParallelLinear, RowParallelLinear
from .params import param


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu2": relu2,  # one launch where Triton runs
    "relu": F.relu,
    "silu": F.silu,
    "gelu": F.gelu,
}


class Linear(nn.Module):
    """`x @ weight.T (+ bias)`; weight `[out, in]` as checkpoints store it."""

    def __init__(self, d_in: int, d_out: int, bias: bool, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(d_out, d_in, device=device, dtype=dtype)
        self.bias = param(d_out, device=device, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class MLP(nn.Module):
    """up_proj `[I, D]`, down_proj `[D, I]`. Under tensor parallelism up_proj is column-parallel and
    down_proj row-parallel over I: the output is this rank's partial sum (the caller all-reduces)."""

    def __init__(self, hidden: int, inner: int, act: str, bias: bool,
                 device: torch.device | str, dtype: torch.dtype, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        part = [head_share(tp, inner, "the MLP's intermediate size")]
        self.up_proj = ColumnParallelLinear(hidden, inner, part, bias, device, dtype)
        self.down_proj = RowParallelLinear(inner, part, hidden, bias, tp, device, dtype)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D] (partial under tensor parallelism)."""
        return self.down_proj(self.act(self.up_proj(x)))
