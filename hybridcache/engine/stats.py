"""`LLM.stats`: the engine's counters (the cache's own are copied in when read)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stats:
    num_suspensions: int = 0
    num_resumes: int = 0
    num_reprefills: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    bytes_to_host: int = 0
    bytes_to_device: int = 0
    num_rebalances: int = 0
    num_aborted_rows: int = 0  # rows of failed steps, restarted from their tokens
    num_steps: int = 0
    num_generated_tokens: int = 0
    step_seconds: float = 0.0  # wall time of committed steps (schedule, forward, sample, commit)
    # prefix caching (vLLM's names): prompt tokens looked up and found cached, at admission
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_evictions: int = 0  # snapshots evicted to make room (with the pages only their chains held)
    num_snapshots_saved: int = 0
    prefix_cache_spills: int = 0  # snapshots moved to the host tier instead of dropped
    prefix_cache_host_hits: int = 0  # admissions whose cached prefix came back from the host tier
    num_snapshots: int = 0  # held now
    snapshot_bytes: int = 0  # device bytes of the snapshots held now
