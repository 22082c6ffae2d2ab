"""The LLM's cache: its roles from the planned model, the device budget (a default when none is given), the
prefix-cache snapshot rows, the demand split between slots and pages, and the manager over them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache import CacheConfig, HybridCacheManager, Sizing, sizing_of
from .policy import DemandSplit, default_host_bytes, snapshot_interval, snapshot_rows

DEFAULT_TOKENS_PER_SEQ = 4096


@dataclass(frozen=True)
class BuiltCache:
    manager: HybridCacheManager
    split: DemandSplit
    sizing: Sizing


def build_cache(planned: torch.nn.Module, num_draft_tokens: int, page_size: int, device: torch.device, *,
                max_model_len: int, max_num_seqs: int, device_cache_bytes: int | None,
                host_cache_bytes: int | None, num_slots: int | None, enable_prefix_caching: bool,
                prefix_snapshot_interval: int | None) -> BuiltCache:
    """`planned`: the model whose state modules and page roles rank 0 plans (every stage's, its shard of
    them). A device budget of None holds `max_num_seqs` sequences at full length, but never more than
    DEFAULT_TOKENS_PER_SEQ tokens each (long-context configs would otherwise ask for terabytes), plus the
    snapshot rows; a host budget of None equals the device's, 4x it with prefix caching
    (`policy.default_host_bytes`); `num_slots` None lets the split follow demand."""
    verify_tokens = num_draft_tokens + 1
    states = planned.state_modules(num_draft_tokens)
    pages = planned.page_roles(page_size)
    sizing = sizing_of(states, pages)
    if device_cache_bytes is None:
        tokens = min(max_model_len, DEFAULT_TOKENS_PER_SEQ) + verify_tokens
        device_cache_bytes = max_num_seqs * sizing.request_bytes(tokens, page_size)
        if enable_prefix_caching:  # the snapshots come on top of the default
            device_cache_bytes += sizing.bytes_for(snapshot_rows(sizing, device_cache_bytes, max_num_seqs), 0)
    snapshots = snapshot_rows(sizing, device_cache_bytes, max_num_seqs) if enable_prefix_caching else 0
    split = DemandSplit(sizing, page_size, device_cache_bytes, snapshots, max_num_seqs, verify_tokens,
                        follow_demand=num_slots is None)
    manager = HybridCacheManager(
        states, pages,
        CacheConfig(device_bytes=device_cache_bytes,
                    host_bytes=default_host_bytes(device_cache_bytes, bool(snapshots)) if host_cache_bytes is None
                    else host_cache_bytes,
                    page_size=page_size, num_slots=split.initial_slots() if num_slots is None else num_slots,
                    num_dummy_slots=0, device=str(device),
                    snapshot_interval=(prefix_snapshot_interval or snapshot_interval(page_size)) if snapshots else 0,
                    num_snapshot_slots=snapshots),
    )
    return BuiltCache(manager, split, sizing)
