"""Decode: T tokens per row (plain decode T = 1, or a verify step without replay) updating the state; and the
gate rule (`gdn_gate`, `RawGate`) that decode and verify can fuse.

On CUDA (triton importable) one fused kernel does it, slots read and written in place
(`delta_rule_triton.py`); elsewhere the torch path through `block`.
"""
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..delta_rule_common import decode_slots, gate_values
from ..triton_support import runs_triton
from .block import block, prepare_qk


def gdn_gate(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
             dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next's gate from the projection's raw outputs: a, b [..., HV]; A_log, dt_bias [HV].

    g = -exp(A_log)·softplus(a + dt_bias) in fp32 (A_log and a cast to fp32 first, dt_bias promoted;
    softplus with torch's threshold 20); beta = sigmoid(b) in b's dtype. Returns (g, beta) [..., HV].
    """
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias), torch.sigmoid(b)


class RawGate(NamedTuple):
    """The gate's inputs, for an op to compute g and beta itself (`gdn_gate`): fused into the kernel on CUDA,
    `gdn_gate` first on the torch path. a, b [B, T, HV] (any dtype; strided views with a unit last stride are
    read in place, e.g. column slices of the in_proj_ba output); A_log, dt_bias [HV]."""

    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor

    def values(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(g fp32, beta in b's dtype) [B, T, HV], exactly `gdn_gate`."""
        return gdn_gate(self.a, self.b, self.A_log, self.dt_bias)


def gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    ssm: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    gate: RawGate | None = None,
) -> torch.Tensor:
    """q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; ssm [S, HV, K, V] fp32; slots [B].

    Runs the T tokens from ssm[slot] (zeros where has_initial is false), writes the state after the last
    token back, returns o [B, T, HV, V] in v's dtype. With `gate` (g and beta None) the gate is computed
    from the projection's raw outputs (`gdn_gate`), inside the kernel on CUDA.
    """
    if runs_triton(q):
        from ..delta_rule_triton import delta_rule_decode_triton  # triton is imported only where it runs

        return delta_rule_decode_triton(q, k, v, g, beta, ssm, slots, has_initial, scale, use_qk_l2norm_in_kernel,
                                        gate=gate)
    g, beta = gate_values(g, beta, gate)
    return decode_slots(block, prepare_qk, q, k, v, g, beta, ssm, slots, has_initial, scale, use_qk_l2norm_in_kernel)
