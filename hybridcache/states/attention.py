"""Page roles of attention layers: paged K/V, or MLA's compressed latent plus rope key."""
from __future__ import annotations

import torch

from ..cache.protocol import PageRoles
from ..cache.roles import RoleSpec
from .split import REPLICATED, HeadSplit, heads


class KVPages(PageRoles):
    """`kv [L, pages, 2, page_size, Hkv, D]` for `num_layers` GQA attention layers."""

    name = "attn"

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, page_size: int, dtype: torch.dtype) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.page_size, self.dtype = page_size, dtype

    def roles(self) -> list[RoleSpec]:
        shape = (2, self.page_size, self.num_kv_heads, self.head_dim)
        return [RoleSpec("kv", self.num_layers, shape, self.dtype)]

    def head_splits(self) -> dict[str, HeadSplit]:
        """By kv head (`[2, page_size, Hkv, D]`); a rank holding one kv head of several ranks' query heads
        holds a copy of it."""
        return {"kv": heads(self.num_kv_heads, 2)}


class MLAPages(PageRoles):
    """`latent [L, pages, page_size, R + Dr]`: the compressed latent, then the rope key, per token."""

    name = "mla"

    def __init__(self, num_layers: int, kv_lora_rank: int, rope_dim: int, page_size: int, dtype: torch.dtype) -> None:
        self.num_layers, self.kv_lora_rank, self.rope_dim = num_layers, kv_lora_rank, rope_dim
        self.page_size, self.dtype = page_size, dtype

    def roles(self) -> list[RoleSpec]:
        return [RoleSpec("latent", self.num_layers, (self.page_size, self.kv_lora_rank + self.rope_dim), self.dtype)]

    def head_splits(self) -> dict[str, HeadSplit]:
        """The latent is replicated: every rank's heads read all of it."""
        return {"latent": REPLICATED}
