"""GQA softmax attention without positional rotation, over the pool's paged K/V."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.attention import paged_attention
from ...parallel import SINGLE, TPGroup, group_share, head_share
from ...parallel.linear import ColumnParallelLinear, RowParallelLinear
from ..batch import ForwardBatch

KV_ROLE = "attn.kv"


class PagedGQAAttention(nn.Module):
    """q_proj `[Hq*Dh, D]`, k_proj / v_proj `[Hkv*Dh, D]`, o_proj `[D, Hq*Dh]`.

    `index` is this layer's position among the model's attention layers (its layer in the `kv` role).
    Tensor parallel: query heads sharded, K/V heads with them (`kv_share`); o_proj row-parallel, so the
    output is this rank's partial sum.
    """

    def __init__(self, index: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool, device: torch.device | str, dtype: torch.dtype, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        (h0, hl), (k0, kl) = head_share(tp, num_heads, "num_attention_heads"), kv_share(tp, num_heads, num_kv_heads)
        self.index, self.num_heads, self.num_kv_heads, self.head_dim = index, hl, kl, head_dim
        d = head_dim
        self.q_proj = ColumnParallelLinear(hidden, num_heads * d, [(h0 * d, hl * d)], bias, device, dtype)
        self.k_proj = ColumnParallelLinear(hidden, num_kv_heads * d, [(k0 * d, kl * d)], bias, device, dtype)
        self.v_proj = ColumnParallelLinear(hidden, num_kv_heads * d, [(k0 * d, kl * d)], bias, device, dtype)
        self.o_proj = RowParallelLinear(num_heads * d, [(h0 * d, hl * d)], hidden, bias, tp, device, dtype)

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


def kv_share(tp: TPGroup, num_heads: int, num_kv_heads: int) -> tuple[int, int]:
    """(first, count) of the K/V heads this rank's query heads read: sharded when the size divides them,
    else the one K/V head of its query heads (each rank keeps a copy in its pages)."""
    return group_share(tp, num_kv_heads, num_heads, "num_key_value_heads")
