"""Qwen3-Next's two norms: the zero-centred RMSNorm `(1 + weight)` and the per-head gated RMSNorm of GDN."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .params import param


class OffsetRMSNorm(nn.Module):
    """`(1 + weight) * x / rms(x)` over the last dim, all in fp32, cast back at the end (weight stored around 0)."""

    def __init__(self, size: int, eps: float, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(size, device=device, dtype=dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., D] -> [..., D]."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """`weight * norm(y) * silu(z)` over the last dim (one value head); norm before gate, weight as stored."""

    def __init__(self, size: int, eps: float, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(size, device=device, dtype=dtype)
        self.eps = eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z: [..., V] -> [..., V] in y's dtype."""
        h = y.float()
        h = self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(y.dtype)
        return (h * F.silu(z.float())).to(y.dtype)
