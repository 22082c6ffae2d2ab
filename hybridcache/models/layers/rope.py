"""Rotary position embedding on the leading `rotary_dim` channels of each head (partial RoPE), half-split layout."""
from __future__ import annotations

import torch
from torch import nn


class PartialRoPE(nn.Module):
    """inv_freq[i] = base^(-2i / rotary_dim); channels [0, rotary_dim) rotate as (x1, x2) halves, the rest pass."""

    def __init__(self, head_dim: int, rotary_dim: int, base: float, device: torch.device | str) -> None:
        super().__init__()
        self.head_dim, self.rotary_dim = head_dim, rotary_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [N] -> cos, sin [N, rotary_dim] in `dtype` (computed in fp32)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [N, H, Dh]; cos, sin: [N, rotary_dim] -> [N, H, Dh]."""
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        x1, x2 = rot.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        rot = rot * cos[:, None] + rotated * sin[:, None]
        return torch.cat([rot, rest], dim=-1)
