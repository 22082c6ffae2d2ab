"""Causal depthwise conv1d over pool conv windows: prefill (flat varlen), decode/verify update, and the
window's accept rule after a verify step. On CUDA the prefill and the update run as Triton kernels
(`triton_conv.py`); elsewhere as torch ops (`fast.py`)."""

from hybridcache.ops.conv1d.fast import causal_conv1d_prefill, causal_conv1d_update, shift_conv_window

__all__ = ["causal_conv1d_prefill", "causal_conv1d_update", "shift_conv_window"]
