"""Gated (SwiGLU-style) MLP `down(act(gate(x)) * up(x))`."""
from __future__ import annotations

import torch
from torch import nn

from ...parallel import SINGLE, TPGroup, head_share
from ...parallel.linear import ColumnParallelLinear, RowParallelLinear
from .mlp import ACTIVATIONS


class GatedMLP(nn.Module):
    """gate_proj, up_proj `[I, D]`, down_proj `[D, I]`, no bias. Under tensor parallelism gate/up are
    column-parallel and down row-parallel over I: the output is this rank's partial sum."""

    def __init__(self, hidden: int, inner: int, act: str, device: torch.device | str, dtype: torch.dtype,
                 tp: TPGroup = SINGLE) -> None:
        super().__init__()
        part = [head_share(tp, inner, "the gated MLP's intermediate size")]
        self.gate_proj = ColumnParallelLinear(hidden, inner, part, False, device, dtype)
        self.up_proj = ColumnParallelLinear(hidden, inner, part, False, device, dtype)
        self.down_proj = RowParallelLinear(inner, part, hidden, False, tp, device, dtype)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D] (partial under tensor parallelism)."""
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
