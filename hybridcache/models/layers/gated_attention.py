"""Qwen3-Next's gated GQA attention: q/k RMSNorm per head, partial RoPE, sigmoid output gate, paged K/V."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.attention import paged_attention
from ...ops.linear import linear
from ...ops.triton_support import runs_triton
from ...parallel import SINGLE, TPGroup, head_share
from ...parallel.linear import RowParallelLinear
from ..batch import ForwardBatch
from .attention import KV_ROLE, fused_params, fused_rows, kv_share
from .norm import RMSNorm
from .rope import PartialRoPE


class GatedPagedAttention(nn.Module):
    """q_proj `[Hq*2*Dh, D]` (per head: Dh query channels, then Dh gate channels), k_proj / v_proj
    `[Hkv*Dh, D]`, q_norm / k_norm `[Dh]` ((1 + w) style), o_proj `[D, Hq*Dh]`. The three input
    projections are row views of one `qkv_weight` (and `qkv_bias`): one GEMM (`attention.fused_rows`).

    `index` is this layer's position among the model's attention layers (its layer in the `kv` role).
    Tensor parallel: query heads (with their gate channels) sharded, K/V heads with them; o_proj
    row-parallel, so the output is this rank's partial sum.
    """

    def __init__(self, index: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool,
                 rope: PartialRoPE, eps: float, device: torch.device | str, dtype: torch.dtype,
                 tp: TPGroup = SINGLE) -> None:
        super().__init__()
        (h0, hl), (k0, kl) = head_share(tp, num_heads, "num_attention_heads"), kv_share(tp, num_heads, num_kv_heads)
        self.index, self.num_heads, self.num_kv_heads, self.head_dim = index, hl, kl, head_dim
        d = head_dim
        self.rows = [("q_proj", num_heads * 2 * d, (h0 * 2 * d, hl * 2 * d)),
                     ("k_proj", num_kv_heads * d, (k0 * d, kl * d)), ("v_proj", num_kv_heads * d, (k0 * d, kl * d))]
        self.qkv_weight, self.qkv_bias = fused_params(self.rows, hidden, bias, device, dtype)
        self.o_proj = RowParallelLinear(num_heads * d, [(h0 * d, hl * d)], hidden, bias, tp, device, dtype)
        self.q_norm = RMSNorm(head_dim, eps, device, dtype, zero_centred=True)
        self.k_norm = RMSNorm(head_dim, eps, device, dtype, zero_centred=True)
        self.rope = rope

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        return fused_rows(self.rows, self.qkv_weight, self.qkv_bias)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x: [N, D] (all rows) -> [N, D], rotated at `batch.positions`; writes the new tokens' K/V into this
        layer's pages."""
        n, dh = x.shape[0], self.head_dim
        hq, hkv = self.num_heads, self.num_kv_heads
        qg, k, v = linear(x, self.qkv_weight, self.qkv_bias).split([hq * 2 * dh, hkv * dh, hkv * dh], dim=-1)
        q, gate = qg.view(n, hq, 2 * dh).split(dh, dim=-1)
        k, v = k.view(n, hkv, dh), v.view(n, hkv, dh)
        if runs_triton(x):  # both norms and both rotations in one launch
            from ...ops.attention.triton_norm_rope import norm_rope_triton  # triton is imported only where it runs
            q, k = norm_rope_triton(q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, batch.positions,
                                    self.rope.inv_freq, self.rope.rotary_dim)
        else:
            cos_sin = self.rope.cos_sin(batch.positions, x.dtype)
            q, k = self.rope(self.q_norm(q), *cos_sin), self.rope(self.k_norm(k), *cos_sin)
        kv = batch.pages[KV_ROLE][self.index]
        o = paged_attention(q, k, v, kv, batch.page_table, batch.cached_lens, batch.cu_seqlens, scale=dh ** -0.5,
                            host=batch.host_rows)
        o = o.reshape(n, -1)
        if runs_triton(x) and o.is_contiguous():  # the gate and the product in one launch
            from ...ops.activation_triton import sigmoid_mul_triton

            return self.o_proj(sigmoid_mul_triton(o, gate))
        return self.o_proj(o * torch.sigmoid(gate).view(n, -1))  # the gate's slice needs no copy
