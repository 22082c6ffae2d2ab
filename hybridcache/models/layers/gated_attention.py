"""Qwen3-Next's gated GQA attention: q/k RMSNorm per head, partial RoPE, sigmoid output gate, paged K/V."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.attention import paged_attention
from ...parallel import SINGLE, TPGroup, head_share
from ...parallel.linear import ColumnParallelLinear, RowParallelLinear
from ..batch import ForwardBatch
from .attention import KV_ROLE, kv_share
from .norm import RMSNorm
from .rope import PartialRoPE


class GatedPagedAttention(nn.Module):
    """q_proj `[Hq*2*Dh, D]` (per head: Dh query channels, then Dh gate channels), k_proj / v_proj
    `[Hkv*Dh, D]`, q_norm / k_norm `[Dh]` ((1 + w) style), o_proj `[D, Hq*Dh]`.

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
        self.q_proj = ColumnParallelLinear(hidden, num_heads * d * 2, [(h0 * 2 * d, hl * 2 * d)], bias, device, dtype)
        self.k_proj = ColumnParallelLinear(hidden, num_kv_heads * d, [(k0 * d, kl * d)], bias, device, dtype)
        self.v_proj = ColumnParallelLinear(hidden, num_kv_heads * d, [(k0 * d, kl * d)], bias, device, dtype)
        self.o_proj = RowParallelLinear(num_heads * d, [(h0 * d, hl * d)], hidden, bias, tp, device, dtype)
        self.q_norm = RMSNorm(head_dim, eps, device, dtype, zero_centred=True)
        self.k_norm = RMSNorm(head_dim, eps, device, dtype, zero_centred=True)
        self.rope = rope

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x: [N, D] (all rows) -> [N, D], rotated at `batch.positions`; writes the new tokens' K/V into this
        layer's pages."""
        n, dh = x.shape[0], self.head_dim
        cos_sin = self.rope.cos_sin(batch.positions, x.dtype)
        q, gate = self.q_proj(x).view(n, self.num_heads, 2 * dh).split(dh, dim=-1)
        q = self.rope(self.q_norm(q), *cos_sin)
        k = self.rope(self.k_norm(self.k_proj(x).view(n, self.num_kv_heads, dh)), *cos_sin)
        v = self.v_proj(x).view(n, self.num_kv_heads, dh)
        kv = batch.pages[KV_ROLE][self.index]
        o = paged_attention(q, k, v, kv, batch.page_table, batch.cached_lens, batch.cu_seqlens, scale=dh ** -0.5,
                            host=batch.host_rows)
        return self.o_proj(o.reshape(n, -1) * torch.sigmoid(gate.reshape(n, -1)))
