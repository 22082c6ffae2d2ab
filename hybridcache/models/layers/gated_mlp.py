"""Gated (SwiGLU-style) MLP `down(act(gate(x)) * up(x))`."""
from __future__ import annotations

import torch
from torch import nn

from .mlp import ACTIVATIONS, Linear


class GatedMLP(nn.Module):
    """gate_proj, up_proj `[I, D]`, down_proj `[D, I]`, no bias."""

    def __init__(self, hidden: int, inner: int, act: str, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, inner, False, device, dtype)
        self.up_proj = Linear(hidden, inner, False, device, dtype)
        self.down_proj = Linear(inner, hidden, False, device, dtype)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D]."""
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
