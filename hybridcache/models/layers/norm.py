"""RMSNorm (plain `w` or zero-centred `1 + w`) and the gated RMSNorms of the recurrent mixers.

All normalise in fp32; they differ in where the weight and the gate apply and in which dtype, as the
checkpoints' reference implementations do, so each gated norm keeps its own `forward`. On CUDA each runs as
one fused Triton kernel (`ops/rms_norm_triton.py`, same rounding points); the torch code below is the
reference and the CPU path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.triton_support import runs_triton
from ...parallel import TPGroup
from .params import param


def rms_normalise(h: torch.Tensor, eps: float) -> torch.Tensor:
    """h: [..., D] (fp32) -> h / rms(h) over the last dim."""
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


class WeightedNorm(nn.Module):
    """A norm with a `weight [size]` as checkpoints store it and an epsilon."""

    def __init__(self, size: int, eps: float, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(size, device=device, dtype=dtype)
        self.eps = eps


class RMSNorm(WeightedNorm):
    """`w * x / rms(x)`, or `(1 + w) * x / rms(x)` when `zero_centred` (the weight is stored around 0, as
    Qwen3-Next's); normalised and weighted in fp32, result in x's dtype."""

    def __init__(self, size: int, eps: float, device: torch.device | str, dtype: torch.dtype,
                 zero_centred: bool = False) -> None:
        super().__init__(size, eps, device, dtype)
        self.zero_centred = zero_centred

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., D] -> [..., D]."""
        if runs_triton(x):
            from ...ops.rms_norm_triton import rms_norm_triton  # triton is imported only where it runs
            return rms_norm_triton(x, self.weight, self.eps, self.zero_centred)
        scale = self.weight.float()
        if self.zero_centred:
            scale = 1.0 + scale
        return (rms_normalise(x.float(), self.eps) * scale).to(x.dtype)

    def add(self, x: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + delta), x + delta), the sum rounded to x's dtype as `x + delta` is: a pre-norm layer's
        residual add and its norm, one fused launch on CUDA. delta None: (norm(x), x)."""
        if delta is None:
            return self(x), x
        if runs_triton(x):
            from ...ops.rms_norm_triton import add_rms_norm_triton
            return add_rms_norm_triton(x, delta, self.weight, self.eps, self.zero_centred)
        x = x + delta
        return self(x), x


class GatedGroupRMSNorm(WeightedNorm):
    """Mamba2's `weight * norm_g(y * silu(z))`: gate first, RMS over each of `groups` equal channel slices.

    `span` = (tp, g, G, width): under tensor parallelism this rank's `size` channels are part of group `g`
    of `G`, `width` channels wide, whose other channels live on other ranks; the sum of squares is then
    all-reduced (a `[N, G]` buffer, each rank adding its group's column)."""

    def __init__(self, size: int, groups: int, eps: float, device: torch.device | str, dtype: torch.dtype,
                 span: tuple[TPGroup, int, int, int] | None = None) -> None:
        super().__init__(size, eps, device, dtype)
        self.groups, self.span = groups, span

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z: [N, I] -> [N, I] in y's dtype (the weight multiplies after the cast, as transformers does)."""
        if self.span is not None:
            tp, g, G, width = self.span
            h = y.float() * F.silu(z.float())
            squares = torch.zeros(h.shape[0], G, device=h.device, dtype=torch.float32)
            squares[:, g] = h.pow(2).sum(-1)
            tp.all_reduce(squares)
            normed = h * torch.rsqrt(squares[:, g : g + 1] / width + self.eps)
            return self.weight * normed.to(y.dtype)
        if runs_triton(y):
            from ...ops.rms_norm_triton import gated_group_rms_norm_triton
            return gated_group_rms_norm_triton(y, z, self.weight, self.groups, self.eps)
        h = y.float() * F.silu(z.float())
        g = rms_normalise(h.view(*h.shape[:-1], self.groups, -1), self.eps)
        return self.weight * g.view(h.shape).to(y.dtype)


class GatedRMSNorm(WeightedNorm):
    """GDN's `weight * norm(y) * silu(z)` over the last dim (one value head); norm before gate, weight as stored."""

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z: [..., V] -> [..., V] in y's dtype."""
        if runs_triton(y):
            from ...ops.rms_norm_triton import gated_rms_norm_triton
            return gated_rms_norm_triton(y, z, self.weight, self.eps)
        h = self.weight * rms_normalise(y.float(), self.eps).to(y.dtype)
        return (h * F.silu(z.float())).to(y.dtype)


class SigmoidGatedRMSNorm(WeightedNorm):
    """KDA's `weight * norm(o) * sigmoid(gate)` over the last dim, all in fp32, result in o's dtype."""

    def forward(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """o, gate: [..., D] -> [..., D]."""
        if runs_triton(o):
            from ...ops.rms_norm_triton import sigmoid_gated_rms_norm_triton
            return sigmoid_gated_rms_norm_triton(o, gate, self.weight, self.eps)
        return (self.weight.float() * rms_normalise(o.float(), self.eps) * torch.sigmoid(gate.float())).to(o.dtype)
