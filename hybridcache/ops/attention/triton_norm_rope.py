"""Qwen3-Next's query / key preprocessing as one Triton launch: per-head zero-centred RMSNorm, then partial
RoPE (half-split layout) at each token's position, for q and k together.

Torch equivalent (models/layers/gated_attention.py's CPU path): ``y = RMSNorm(x)`` normalised and weighted by
``1 + w`` in fp32, rounded to x's dtype; ``cos, sin`` of ``pos * inv_freq`` (fp32) rounded to x's dtype;
channels ``c < rot`` become ``y[c] * cos[c] + r[c] * sin[c]`` with ``r = cat(-y2, y1)`` of the halves, each
product and the sum rounded to x's dtype (as torch's bf16 ops round); channels ``c >= rot`` pass. Each
program normalises one (token, head) row; the partner channel ``c +- rot / 2`` is loaded and normalised
beside it, so no lanes are exchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..pdl_triton import pdl_entry, pdl_launch


@triton.jit
def _norm_rope_kernel(
    q_ptr, k_ptr, qw_ptr, kw_ptr, pos_ptr, freq_ptr, qo_ptr, ko_ptr,
    stride_qn, stride_qh, stride_kn, stride_kh, eps,
    Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, ROTARY: tl.constexpr,
    BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    n, h = tl.program_id(0), tl.program_id(1)
    is_q = h < Q_HEADS
    hk = tl.maximum(h - Q_HEADS, 0)
    n64 = n.to(tl.int64)
    src = tl.where(is_q, q_ptr + n64 * stride_qn + h * stride_qh, k_ptr + n64 * stride_kn + hk * stride_kh)
    w_ptr = tl.where(is_q, qw_ptr, kw_ptr)
    dst = tl.where(is_q, qo_ptr + (n64 * Q_HEADS + h) * HEAD_DIM, ko_ptr + (n64 * K_HEADS + hk) * HEAD_DIM)

    c = tl.arange(0, BLOCK_D)
    ok = c < HEAD_DIM
    x = tl.load(src + c, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / HEAD_DIM + eps)
    y = (x * rstd * (1.0 + tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32))).to(qo_ptr.dtype.element_ty)

    half: tl.constexpr = ROTARY // 2
    rot = c < ROTARY
    first = c < half
    partner = tl.where(first, c + half, c - half)
    xp = tl.load(src + partner, mask=rot, other=0.0).to(tl.float32)
    yp = (xp * rstd * (1.0 + tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32))).to(y.dtype)
    turned = tl.where(first, -yp.to(tl.float32), yp.to(tl.float32))  # cat(-y2, y1); negated exactly in fp32
    angle = tl.load(pos_ptr + n).to(tl.float32) * tl.load(freq_ptr + (c % half), mask=rot, other=0.0)
    cos, sin = tl.cos(angle).to(y.dtype), tl.sin(angle).to(y.dtype)
    a = (y.to(tl.float32) * cos.to(tl.float32)).to(y.dtype)
    b = (turned * sin.to(tl.float32)).to(y.dtype)
    out = tl.where(rot, (a.to(tl.float32) + b.to(tl.float32)).to(y.dtype), y)
    tl.store(dst + c, out, mask=ok)


def norm_rope_triton(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float, positions: Tensor,
                     inv_freq: Tensor, rotary_dim: int) -> tuple[Tensor, Tensor]:
    """q: [N, Hq, Dh], k: [N, Hkv, Dh] (any strides with a unit last one); q_weight, k_weight: [Dh] (stored
    around 0: the scale is 1 + w); positions: [N] int; inv_freq: [rotary_dim / 2] fp32. Returns the
    normalised, rotated q and k, contiguous, in q's dtype (k must share it)."""
    n, hq, dh = q.shape
    hkv = k.shape[1]
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > dh or k.shape[-1] != dh or k.dtype != q.dtype:
        raise ValueError(f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, rotary_dim {rotary_dim}: "
                         "need one dtype and head dim, and an even rotary_dim in [2, head dim]")
    q_out = torch.empty(n, hq, dh, dtype=q.dtype, device=q.device)
    k_out = torch.empty(n, hkv, dh, dtype=q.dtype, device=q.device)
    if n == 0:
        return q_out, k_out
    _norm_rope_kernel[(n, hq + hkv)](
        q, k, q_weight, k_weight, positions, inv_freq, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), eps,
        Q_HEADS=hq, K_HEADS=hkv, HEAD_DIM=dh, ROTARY=rotary_dim, BLOCK_D=triton.next_power_of_2(dh), **pdl_launch(q),
    )
    return q_out, k_out
