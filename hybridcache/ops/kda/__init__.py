"""Kimi Delta Attention: chunked prefill, decode, verify with pending-draft caches, and the decay gate.

Layouts follow flash-linear-attention (q, k, g [B, T, H, K], v [B, T, H, V], beta [B, T, H]); pool roles
follow docs/layouts.md. References with the same signatures live in `naive.py`.
"""
from .accept import kda_accept
from .block import l2norm
from .chunk import chunk_kda, kda_prefill
from .decode import kda_decode
from .gate import KDARawGate, kda_gate
from .verify import kda_effective_state, kda_verify

__all__ = [
    "KDARawGate",
    "chunk_kda",
    "kda_accept",
    "kda_decode",
    "kda_effective_state",
    "kda_gate",
    "kda_prefill",
    "kda_verify",
    "l2norm",
]
