"""Reference causal depthwise conv1d over slot windows (readable, per-row loops).

Conv role (docs/layouts.md): `conv [S, C, W + k]`, `W = K - 1`; the valid window is `conv[s, :, :W]`,
oldest input first. Arithmetic in fp32; outputs in x's dtype; the role keeps its own dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _conv_full(seq: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None) -> Tensor:
    """Valid convolution. seq: [C, W + L] fp32; weight: [C, K]. Returns [L, C] fp32."""
    width = weight.shape[1]
    length = seq.shape[1] - width + 1
    out = torch.zeros(length, seq.shape[0], dtype=torch.float32, device=seq.device)
    for t in range(length):
        out[t] = (seq[:, t : t + width] * weight.float()).sum(-1)
        if bias is not None:
            out[t] += bias.float()
    if activation == "silu":
        out = F.silu(out)
    elif activation is not None:
        raise ValueError(f"unknown activation {activation!r}")
    return out


def causal_conv1d_prefill_ref(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    conv: Tensor,
    slots: Tensor,
    has_initial: Tensor,
    cu_seqlens: Tensor,
    activation: str | None = None,
) -> Tensor:
    """Prefill over a flat variable-length batch.

    x: [N, C]; weight: [C, K]; bias: [C] or None; conv: [S, C, W + k] (written in place);
    slots: [B] int64 (negative = padding); has_initial: [B] bool; cu_seqlens: [B + 1].
    Row b's tokens are x[cu_seqlens[b]:cu_seqlens[b+1]]; it starts from conv[slot, :, :W] (zeros when
    not has_initial or padding) and leaves its last W inputs in conv[slot, :, :W].
    Returns y: [N, C] in x's dtype.
    """
    w = weight.shape[1] - 1
    y = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    for b in range(slots.shape[0]):
        start, end = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        slot = int(slots[b])
        window = torch.zeros(x.shape[1], w, dtype=torch.float32, device=x.device)
        if slot >= 0 and bool(has_initial[b]):
            window = conv[slot, :, :w].float()
        seq = torch.cat([window, x[start:end].float().T], dim=1)
        y[start:end] = _conv_full(seq, weight, bias, activation).to(x.dtype)
        if slot >= 0:
            conv[slot, :, :w] = seq[:, seq.shape[1] - w :].to(conv.dtype)
    return y


def causal_conv1d_update_ref(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    conv: Tensor,
    slots: Tensor,
    activation: str | None = None,
) -> Tensor:
    """Decode (T = 1) or verify (T = k + 1) step.

    x: [B, T, C]; conv: [S, C, W + k] (written in place). Each row reads conv[slot, :, :W] and writes
    cat(window, x)[:, 1:] (width W + T - 1) into conv[slot, :, :W + T - 1]; for T = 1 that is the new
    window. Returns y: [B, T, C] in x's dtype.
    """
    w = weight.shape[1] - 1
    batch, steps, channels = x.shape
    if w + steps - 1 > conv.shape[-1]:
        raise ValueError(f"T={steps} needs a conv role of width >= {w + steps - 1}, got {conv.shape[-1]}")
    y = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    for b in range(batch):
        slot = int(slots[b])
        window = torch.zeros(channels, w, dtype=torch.float32, device=x.device)
        if slot >= 0:
            window = conv[slot, :, :w].float()
        seq = torch.cat([window, x[b].float().T], dim=1)
        y[b] = _conv_full(seq, weight, bias, activation).to(x.dtype)
        if slot >= 0:
            conv[slot, :, : w + steps - 1] = seq[:, 1:].to(conv.dtype)
    return y
