"""Causal depthwise conv1d over pool conv windows: prefill (flat varlen) and decode/verify update."""

from hybridcache.ops.conv1d.fast import causal_conv1d_prefill, causal_conv1d_update

__all__ = ["causal_conv1d_prefill", "causal_conv1d_update"]
