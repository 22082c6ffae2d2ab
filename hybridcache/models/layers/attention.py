"""GQA softmax attention without positional rotation, over the pool's paged K/V."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.attention import paged_attention
from ..batch import ForwardBatch
from .mlp import Linear

KV_ROLE = "attn.kv"


class PagedGQAAttention(nn.Module):
    """q_proj `[Hq*Dh, D]`, k_proj / v_proj `[Hkv*Dh, D]`, o_proj `[D, Hq*Dh]`.

    `index` is this layer's position among the model's attention layers (its layer in the `kv` role).
    """

    def __init__(self, index: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.index, self.num_heads, self.num_kv_heads, self.head_dim = index, num_heads, num_kv_heads, head_dim
        self.q_proj = Linear(hidden, num_heads * head_dim, bias, device, dtype)
        self.k_proj = Linear(hidden, num_kv_heads * head_dim, bias, device, dtype)
        self.v_proj = Linear(hidden, num_kv_heads * head_dim, bias, device, dtype)
        self.o_proj = Linear(num_heads * head_dim, hidden, bias, device, dtype)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x: [N, D] (all rows, context and generation) -> [N, D]; writes the new tokens' K/V into the pages."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        kv = batch.pages[KV_ROLE][self.index]
        o = paged_attention(q, k, v, kv, batch.page_table, batch.cached_lens, batch.cu_seqlens,
                            scale=self.head_dim ** -0.5, host=batch.host_rows)
        return self.o_proj(o.reshape(n, -1))
