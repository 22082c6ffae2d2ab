"""Softmax attention over paged KV (GQA) and Kimi Linear's MLA over paged latents.

Fast functions (vectorized torch) are exported here; ``naive`` holds the references with the same
signatures. Layouts: docs/layouts.md, "Attention pages".
"""

from hybridcache.ops.attention._layout import HostRows, PageTableError
from hybridcache.ops.attention.mla import mla_paged_attention, write_latent
from hybridcache.ops.attention.paged import attend_kv_pages, paged_attention, write_kv

__all__ = [
    "HostRows",
    "PageTableError",
    "attend_kv_pages",
    "mla_paged_attention",
    "paged_attention",
    "write_kv",
    "write_latent",
]
