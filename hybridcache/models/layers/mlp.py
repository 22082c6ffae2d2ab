"""Non-gated MLP `down(act(up(x)))` and the activations checkpoints name."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .params import param


def _relu2(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu2": _relu2,
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
        return F.linear(x, self.weight, self.bias)


class MLP(nn.Module):
    """up_proj `[I, D]`, down_proj `[D, I]`."""

    def __init__(self, hidden: int, inner: int, act: str, bias: bool,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.up_proj = Linear(hidden, inner, bias, device, dtype)
        self.down_proj = Linear(inner, hidden, bias, device, dtype)
        self.act = ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D]."""
        return self.down_proj(self.act(self.up_proj(x)))
