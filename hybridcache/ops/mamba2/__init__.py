"""Mamba2 (SSD): chunked prefill, single-token decode and replay verify over the pool's roles."""

from hybridcache.ops.mamba2.decode import mamba2_decode
from hybridcache.ops.mamba2.prefill import mamba2_chunk_scan_varlen, mamba2_prefill
from hybridcache.ops.mamba2.replay import mamba2_verify, replay_state
from hybridcache.ops.replay_accept import replay_accept as mamba2_accept  # shared by every replay layer kind

__all__ = [
    "mamba2_accept",
    "mamba2_chunk_scan_varlen",
    "mamba2_decode",
    "mamba2_prefill",
    "mamba2_verify",
    "replay_state",
]
