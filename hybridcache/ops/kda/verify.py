"""Speculative verify with pending-draft caches (docs/layouts.md, KDA) and the effective-state helper.

No host sync: padding rows are kept out of the writes by `hybridcache.ops.slot_io`.
"""
import torch

from ..delta_rule_common import gate_values, head_major
from ..slot_io import RowScatter, put_rows, read_rows
from ..triton_support import runs_triton
from .block import block, prepare_qk
from .gate import KDARawGate
from .pending import read_pending


def kda_effective_state(
    ssm: torch.Tensor,
    pend_k: torch.Tensor,
    pend_g: torch.Tensor,
    pend_v: torch.Tensor,
    pend_beta: torch.Tensor,
    pend_n: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """ssm [S, H, K, V] plus the accepted pending drafts -> [B, H, K, V] fp32; nothing is written."""
    h = read_rows(ssm, slots)
    if pend_k.shape[1] == 0:
        return h
    p = read_pending(pend_k, pend_g, pend_v, pend_beta, pend_n, slots)
    return block(h, torch.zeros_like(p.k), p.k, p.v, p.g, p.beta)[1]


def kda_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    ssm: torch.Tensor,
    pend_k: torch.Tensor,
    pend_g: torch.Tensor,
    pend_v: torch.Tensor,
    pend_beta: torch.Tensor,
    pend_n: torch.Tensor,
    slots: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    gate: KDARawGate | None = None,
) -> torch.Tensor:
    """Verify T tokens per row (T - 1 <= draft capacity P).

    q, k, g [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; ssm [S, H, K, V] fp32; pend_k, pend_g [S, P, H, K]
    (normalised keys; fp32 log-decay); pend_v [S, P, H, V]; pend_beta [S, P, H]; pend_n [S] (read only).
    Replays pend_*[:pend_n] into the state, runs the T tokens, writes ssm = state after new token 0 and
    pend_*[:T-1] = tokens 1..T-1. Returns o [B, T, H, V] in v's dtype.
    With `gate` (g and beta None) g and beta are computed from the projections' raw outputs
    (`KDARawGate.values`); pend_g and pend_beta get the same values as with g, beta given.
    On CUDA with triton this is fused Triton kernels (`delta_rule_verify_triton.kda_verify_triton`), the gate
    included.
    """
    if runs_triton(q):
        from .triton_verify import kda_verify_triton

        return kda_verify_triton(q, k, v, g, beta, ssm, pend_k, pend_g, pend_v, pend_beta, pend_n, slots, scale,
                                 use_qk_l2norm_in_kernel, gate=gate)
    g, beta = gate_values(g, beta, gate)
    P, T = pend_k.shape[1], q.shape[1]
    assert T - 1 <= P, f"a verify step of {T} tokens needs pending caches for {T - 1} drafts, have {P}"
    qn, kn = prepare_qk(q, k, scale, use_qk_l2norm_in_kernel)
    vt, gt, bt = head_major(v, g, beta)
    h = read_rows(ssm, slots)
    p = read_pending(pend_k, pend_g, pend_v, pend_beta, pend_n, slots)
    # one block: the P pending slots (identity past pend_n), then the T new tokens
    o, h_new = block(
        h,
        torch.cat([torch.zeros_like(p.k), qn], dim=-2),
        torch.cat([p.k, kn], dim=-2),
        torch.cat([p.v, vt], dim=-2),
        torch.cat([p.g, gt], dim=-2),
        torch.cat([p.beta, bt], dim=-1),
        at=P,
    )
    valid = slots >= 0
    put_rows(ssm, (slots,), h_new, valid)
    # pend_*[slot, :T-1] <- tokens 1..T-1, [B, T - 1, H, ...]
    scatter = RowScatter((slots[:, None], torch.arange(T - 1, device=slots.device)[None]), valid)
    scatter.put(pend_k, kn[:, :, 1:].transpose(1, 2))
    scatter.put(pend_g, g[:, 1:])
    scatter.put(pend_v, v[:, 1:])
    scatter.put(pend_beta, beta[:, 1:])
    return o[..., P:, :].transpose(1, 2).to(v.dtype)
