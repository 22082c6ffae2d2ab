"""Gated DeltaNet (Qwen3-Next): chunked prefill, decode, replay verify and its bookkeeping.

Layouts follow flash-linear-attention (q, k [B, T, H, K], v [B, T, HV, V], HV = H·r); pool roles follow
docs/layouts.md. References with the same signatures live in `naive.py`. Decode and verify take the gate as
g, beta or as the projection's raw outputs (`gate=RawGate(a, b, A_log, dt_bias)`, the rule in `gdn_gate`),
which the CUDA kernels compute in place.
"""
from ..replay_accept import replay_accept as gdn_accept  # the accept rule every replay layer kind shares
from .block import l2norm
from .chunk import chunk_gated_delta_rule, gdn_prefill
from .decode import RawGate, gdn_decode, gdn_gate
from .replay import gdn_replay_state, gdn_verify

__all__ = [
    "RawGate",
    "chunk_gated_delta_rule",
    "gdn_accept",
    "gdn_decode",
    "gdn_gate",
    "gdn_prefill",
    "gdn_replay_state",
    "gdn_verify",
    "l2norm",
]
