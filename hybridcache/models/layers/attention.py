"""GQA softmax attention without positional rotation, over the pool's paged K/V."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ...ops.attention import paged_attention
from ...ops.linear import linear
from ...parallel import SINGLE, TPGroup, group_share, head_share, shard
from ...parallel.linear import RowParallelLinear
from ..batch import ForwardBatch
from .params import param

KV_ROLE = "attn.kv"


class PagedGQAAttention(nn.Module):
    """q_proj `[Hq*Dh, D]`, k_proj / v_proj `[Hkv*Dh, D]`, o_proj `[D, Hq*Dh]`.

    The three input projections are row views of one `qkv_weight` `[(Hq + 2*Hkv)*Dh, D]` (and `qkv_bias`),
    so one GEMM gives cat(q, k, v); see `fused_rows` (KDAMixer's `in_weight` is laid out so too).
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
        self.rows = [("q_proj", num_heads * d, (h0 * d, hl * d)), ("k_proj", num_kv_heads * d, (k0 * d, kl * d)),
                     ("v_proj", num_kv_heads * d, (k0 * d, kl * d))]
        self.qkv_weight, self.qkv_bias = fused_params(self.rows, hidden, bias, device, dtype)
        self.o_proj = RowParallelLinear(num_heads * d, [(h0 * d, hl * d)], hidden, bias, tp, device, dtype)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        return fused_rows(self.rows, self.qkv_weight, self.qkv_bias)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x: [N, D] (all rows, context and generation) -> [N, D]; writes the new tokens' K/V into the pages."""
        n, dh = x.shape[0], self.head_dim
        q, k, v = linear(x, self.qkv_weight, self.qkv_bias).split(
            [self.num_heads * dh, self.num_kv_heads * dh, self.num_kv_heads * dh], dim=-1)
        kv = batch.pages[KV_ROLE][self.index]
        o = paged_attention(q.view(n, self.num_heads, dh), k.view(n, self.num_kv_heads, dh),
                            v.view(n, self.num_kv_heads, dh), kv, batch.page_table, batch.cached_lens,
                            batch.cu_seqlens, scale=dh ** -0.5, host=batch.host_rows)
        return self.o_proj(o.reshape(n, -1))


def kv_share(tp: TPGroup, num_heads: int, num_kv_heads: int) -> tuple[int, int]:
    """(first, count) of the K/V heads this rank's query heads read: sharded when the size divides them,
    else the one K/V head of its query heads (each rank keeps a copy in its pages)."""
    return group_share(tp, num_kv_heads, num_heads, "num_key_value_heads")


Rows = Sequence[tuple[str, int, tuple[int, int]]]  # (checkpoint name, full rows, this rank's (start, count))


def fused_params(rows: Rows, hidden: int, bias: bool, device: torch.device | str,
                 dtype: torch.dtype) -> tuple[nn.Parameter, nn.Parameter | None]:
    """One weight `[sum of counts, hidden]` (and bias `[sum of counts]`) for several column-parallel linears."""
    out = sum(count for _, _, (_, count) in rows)
    return param(out, hidden, device=device, dtype=dtype), (param(out, device=device, dtype=dtype) if bias else None)


def fused_rows(rows: Rows, weight: torch.Tensor, bias: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The checkpoint's `<name>.weight` (and `.bias`) of each linear in `rows` as row views of the fused
    weight (bias), sharded as a column-parallel linear's. The loader fills the views name for name, so the
    fused tensors hold the checkpoint's values with nothing more to do; replacing (not filling) a
    parameter, e.g. `Module.to`, would break the sharing — load with `load_model` on the target device."""
    counts = [count for _, _, (_, count) in rows]
    out = {}
    for (name, full, share), w, b in zip(rows, weight.split(counts), bias.split(counts) if bias is not None else
                                         [None] * len(rows)):
        out[f"{name}.weight"] = shard(w, 0, full, share)
        if b is not None:
            out[f"{name}.bias"] = shard(b, 0, full, share)
    return out
