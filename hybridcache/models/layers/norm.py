"""RMSNorm, and the gated group-wise RMSNorm of Mamba2 mixers."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .params import param


class RMSNorm(nn.Module):
    """`weight * x / rms(x)`, normalised in fp32, weight applied in fp32, result in x's dtype."""

    def __init__(self, size: int, eps: float, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(size, device=device, dtype=dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D]."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * h).to(x.dtype)


class GatedGroupRMSNorm(nn.Module):
    """`weight * norm_g(y * silu(z))` with the RMS taken over each of `groups` equal slices of the channels."""

    def __init__(self, size: int, groups: int, eps: float, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(size, device=device, dtype=dtype)
        self.groups, self.eps = groups, eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z: [N, I] -> [N, I] in y's dtype (the weight multiplies after the cast, as transformers does)."""
        h = y.float() * F.silu(z.float())
        g = h.view(*h.shape[:-1], self.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.view(h.shape).to(y.dtype)
