"""KDA decode: T tokens per row from the slot's state, writing the state after the last one.

On CUDA (triton importable) one fused kernel does it, slots read and written in place
(`delta_rule_triton.py`); elsewhere the torch path through `block`.
"""
import torch

from ..delta_rule_common import decode_slots, gate_values
from ..triton_support import runs_triton
from .block import block, prepare_qk
from .gate import KDARawGate


def kda_decode(
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
    gate: KDARawGate | None = None,
) -> torch.Tensor:
    """q, k, g [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; ssm [S, H, K, V] fp32; slots [B].

    Returns o [B, T, H, V] in v's dtype. With `gate` (g and beta None) g and beta are computed from the
    projections' raw outputs (`KDARawGate.values`), inside the kernel on CUDA.
    """
    if runs_triton(q):
        from ..delta_rule_triton import delta_rule_decode_triton  # triton is imported only where it runs

        return delta_rule_decode_triton(q, k, v, g, beta, ssm, slots, has_initial, scale, use_qk_l2norm_in_kernel,
                                        gate=gate)
    g, beta = gate_values(g, beta, gate)
    return decode_slots(block, prepare_qk, q, k, v, g, beta, ssm, slots, has_initial, scale, use_qk_l2norm_in_kernel)
