"""KDA's verify with pending drafts as two Triton launches (the work split: `ops/delta_rule_verify_triton.py`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..delta_rule_triton import kda_raw_gate, unit_last
from ..delta_rule_verify_triton import key_l2norm, pending_row, state_tile, verify_tile_sizes, verify_warps
from ..pdl_triton import pdl_entry, pdl_launch
from . import triton_verify_closed as closed

if TYPE_CHECKING:
    from .gate import KDARawGate

# the first launch in closed form (`triton_verify_closed.py`, its own kernel on this one's arguments) for verify
# steps of T > 1; off until timed (benchmarks/gpu/kda_closed.sh)
CLOSED_FORM = False


@triton.jit
def _decay_rows(h, d, g):
    """The state diag(d)·h [BK, BV] after a token's decay e^g [BK] of its key rows: only d changes, the tile is
    rescaled (and d reset to ones) when d leaves [1e-30, 1e30], so that k/d and d·k stay finite. -> (h, d)."""
    d = d * tl.exp(g)
    if (tl.min(d, 0) < 1e-30) | (tl.max(d, 0) > 1e30):
        h = h * d[:, None]
        d = tl.zeros_like(d) + 1.0
    return h, d


@triton.jit
def _new_token(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, dtb_ptr, row, t, hd, kk, k_ok, vv, v_ok, neg_A,
               s_qb, s_qt, s_qh, s_kib, s_kit, s_kih, s_vib, s_vit, s_vih, s_gib, s_git, s_gih, s_bib, s_bit, s_bih,
               K: tl.constexpr, L2NORM: tl.constexpr, RAW_GATE: tl.constexpr):
    """New token t of the row: (q, k, g [BK], v [BV], beta) in fp32, keys normalised, g and beta from the raw
    gate where RAW_GATE (dt_bias read again each token, from L1, rather than held beside the tile)."""
    g = tl.load(g_ptr + row * s_gib + t * s_git + hd * s_gih + kk, mask=k_ok, other=0.0).to(tl.float32)
    b = tl.load(beta_ptr + row * s_bib + t * s_bit + hd * s_bih).to(tl.float32)
    k = tl.load(k_ptr + row * s_kib + t * s_kit + hd * s_kih + kk, mask=k_ok, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + row * s_vib + t * s_vit + hd * s_vih + vv, mask=v_ok, other=0.0).to(tl.float32)
    q = tl.load(q_ptr + row * s_qb + t * s_qt + hd * s_qh + kk, mask=k_ok, other=0.0).to(tl.float32)
    if RAW_GATE:
        dt_bias = tl.load(dtb_ptr + hd * K + kk, mask=k_ok, other=0.0).to(tl.float32)
        g, b = kda_raw_gate(g, b, neg_A, dt_bias, beta_ptr.dtype.element_ty)  # beta rounded to b's dtype
    if L2NORM:
        k = key_l2norm(k, True)
        q = key_l2norm(q, True)
    return q, k, g, v, b


@triton.jit
def _pending_draft(pk_ptr, pg_ptr, pv_ptr, pb_ptr, s, j, hd, kk, k_ok, vv, v_ok,
                   s_ks, s_kp, s_kh, s_kk, s_gs, s_gp, s_gh, s_gk, s_vs, s_vp, s_vh, s_vv, s_bs, s_bp, s_bh):
    """Pending draft j of slot s: (k, g [BK], v [BV], beta) in fp32."""
    k = tl.load(pk_ptr + s * s_ks + j * s_kp + hd * s_kh + kk * s_kk, mask=k_ok, other=0.0).to(tl.float32)
    g = tl.load(pg_ptr + s * s_gs + j * s_gp + hd * s_gh + kk * s_gk, mask=k_ok, other=0.0).to(tl.float32)
    v = tl.load(pv_ptr + s * s_vs + j * s_vp + hd * s_vh + vv * s_vv, mask=v_ok, other=0.0).to(tl.float32)
    b = tl.load(pb_ptr + s * s_bs + j * s_bp + hd * s_bh).to(tl.float32)
    return k, g, v, b


@triton.jit
def _verify_tile(h, s, valid, n, row, hd, kk, k_ok, vv, v_ok, tile, ssm_tile,
                 q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, o_ptr, pk_ptr, pg_ptr, pv_ptr, pb_ptr, scale,
                 s_qb, s_qt, s_qh, s_kib, s_kit, s_kih, s_vib, s_vit, s_vih, s_gib, s_git, s_gih, s_bib, s_bit, s_bih,
                 s_ks, s_kp, s_kh, s_kk, s_gs, s_gp, s_gh, s_gk, s_vs, s_vp, s_vh, s_vv, s_bs, s_bp, s_bh,
                 T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                 L2NORM: tl.constexpr, RAW_GATE: tl.constexpr):
    """One (row, head, value block) from its loaded tile h [BK, BV] of slot s: the n accepted pending drafts, then
    the T new tokens; stores the outputs, and the state after new token 0 where `valid`."""
    d = tl.zeros([BK], dtype=tl.float32) + 1.0

    # the accepted pending drafts [0, pend_n)
    for j in range(0, n):
        k_j, g_j, v_j, b_j = _pending_draft(pk_ptr, pg_ptr, pv_ptr, pb_ptr, s, j, hd, kk, k_ok, vv, v_ok,
                                            s_ks, s_kp, s_kh, s_kk, s_gs, s_gp, s_gh, s_gk, s_vs, s_vp, s_vh, s_vv,
                                            s_bs, s_bp, s_bh)
        h, d = _decay_rows(h, d, g_j)
        u_j = b_j * (v_j - tl.sum(h * (d * k_j)[:, None], 0))
        h += (k_j / d)[:, None] * u_j[None, :]

    neg_A = 0.0
    if RAW_GATE:
        neg_A = -tl.exp(tl.load(alog_ptr + hd).to(tl.float32))
    for t in tl.static_range(T):
        q_t, k_t, g_t, v_t, b_t = _new_token(
            q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, dtb_ptr, row, t, hd, kk, k_ok, vv, v_ok, neg_A,
            s_qb, s_qt, s_qh, s_kib, s_kit, s_kih, s_vib, s_vit, s_vih, s_gib, s_git, s_gih, s_bib, s_bit, s_bih,
            K, L2NORM, RAW_GATE)
        h, d = _decay_rows(h, d, g_t)
        u_t = b_t * (v_t - tl.sum(h * (d * k_t)[:, None], 0))
        h += (k_t / d)[:, None] * u_t[None, :]
        o_t = tl.where(valid, tl.sum(h * (d * q_t * scale)[:, None], 0), 0.0)
        tl.store(o_ptr + ((row * T + t) * H + hd) * V + vv, o_t.to(o_ptr.dtype.element_ty), mask=v_ok)
        if t == 0:
            tl.store(ssm_tile, h * d[:, None], mask=tile & valid)


@triton.jit
def _kda_verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, o_ptr,
    ssm_ptr, pk_ptr, pg_ptr, pv_ptr, pb_ptr, n_ptr, slot_ptr,
    scale,
    s_qb, s_qt, s_qh, s_kib, s_kit, s_kih, s_vib, s_vit, s_vih, s_gib, s_git, s_gih, s_bib, s_bit, s_bih,
    s_ss, s_sh, s_sk, s_sv,
    s_ks, s_kp, s_kh, s_kk,
    s_gs, s_gp, s_gh, s_gk,
    s_vs, s_vp, s_vh, s_vv,
    s_bs, s_bp, s_bh,
    s_n,
    T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, P: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, NVB: tl.constexpr, L2NORM: tl.constexpr, RAW_GATE: tl.constexpr,
    PDL: tl.constexpr,
):
    """q, k, g, v, beta [B, T, H, ...] by their strides (s_q*, s_ki*, s_vi*, s_gi*, s_bi*; unit last);
    RAW_GATE: g_ptr and beta_ptr hold the raw g_raw, b, alog_ptr and dtb_ptr A_log [H], dt_bias [H·K]. One
    program an item (row, head, value block) on a grid (B, H, NVB).

    The rows' decays are kept as a scale d beside the tile, the state diag(d)·h: hᵀk = hᵀ(d⊙k), the update
    h += (k/d)·uᵀ, hᵀq = hᵀ(d⊙q); three passes over the tile a token (two a pending draft), and one more to store
    the state after new token 0. Applying each decay to the tile (four passes) was slower: H100, 32 value
    columns x 1 warp, us at batch 16 / 64 / 256, 24.5 / 100.1 / 386.0 against 22.6 / 94.4 / 360.0 (no drafts
    pending: 21.3 / 85.3 / 322.1 against 20.2 / 83.7 / 311.9; ops_kda.py's replay verify and accept at batch 64 /
    256, 0.123 / 0.546 ms against 0.095 / 0.361), and at sm_90 it spilled 124 bytes a thread against none. As
    it stands (H100, session 43): 21.3 / 85.3 / 318.6 us, 18.9 / 74.8 / 271.5 with no drafts pending. Nsight
    Compute at batch 64: one warp a program at 255 registers, so 8 warps an SM; most stalls wait on loads. Yet
    loading the next token's or draft's vectors before this one's passes was slower (120 bytes spilled; 87.9 /
    326.5 us at batch 64 / 256).

    A token's hᵀk and hᵀq reduced side by side from the decayed tile, o = hᵀq + (k·q)·u, the last update skipped,
    was slower (H200, 32 value columns x 1 warp, us at batch 16 / 64 / 256: 24.2 / 94.8 / 364.8 against 23.2 /
    88.0 / 340.7). So was a closed form (session 42) that took the drafts and new tokens as one sequence and met
    the state only in products (h₀ᵀ(e^Γ⊙k), h₀ᵀ(e^Γ⊙q) and the stored state's e^{Γ_n}⊙h₀ + Wᵀu), with the decays
    between rows taken a pair of rows at a time over [16, K] (per key row: e^{Γ_r−Γ_s} split into two factors
    overflows for strong decays): H100, us at batch 16 / 64 / 256, 88.8 / 317.5 / 1,217.6 at its best tiling
    (64 columns x 4 warps) against 23.7 / 100.2 / 386.3 for the token-by-token kernel then; the per-pair work,
    repeated by every value block and reduced across warps, outweighs the state passes saved.

    Nor did a cap on its registers pay (Triton's maxnreg, for more programs an SM; sessions 43-45, history commit
    7cf4f06): H100, 32 value columns x 1 warp, us at batch 64 / 256, none 84.4 / 319.7, 224 94.2 / 354.2, 200
    101.3 / 383.5, 168 131.1 / 491.5, 128 206.6 / 784.1 (benchmarks/tune_delta_rule.py in one call). Nor did
    prefetching every token's and pending draft's vectors at entry (PTX prefetch.global to L1 or L2, no registers
    held; session 46, history bea4967): H100, us at batch 16 / 64 / 256, none 21.0 / 84.3 / 313.6, L1 21.2 / 84.9
    / 313.3, L2 21.1 / 84.7 / 313.9; the per-token loads are not what the program waits on. Nor did a persistent
    grid (session 47, history cf476ba): 8 or 16 warps an SM, each program taking items pid, pid + programs, …, the
    next item's tile loaded before this one's passes; H100, us at batch 16 / 64 / 256, its best tiling (16 columns
    x 1 warp, 8 warps an SM) 25.1 / 98.6 / 362.3 against 20.9 / 84.1 / 312.1 (ops_kda.py replay ms 0.026 / 0.102 /
    0.358 against 0.022 / 0.089 / 0.334). Nor did that grid with the next item's tile and vectors copied into shared
    memory by Triton's software pipeline (cp.async, two stages, no registers held; the pending drafts as P guarded
    steps; session 59, history 94a3aeb; at 32 value columns it spilled 1,200 bytes a thread; on CUDA its values
    differed from the one-item form's in 4 of its 14 bit-for-bit tests): H100, ops_kda.py replay ms at batch 16 /
    64 / 256, 16 columns 0.038 / 0.130 / 0.520, 8 columns 0.038 / 0.138 / 0.524, against 0.024 / 0.089 / 0.336;
    tune_delta_rule.py us at batch 64 / 256, its best (16 x 1) 96.5 / 365.0 against 84.6 / 315.5 at 32 x 1.

    Where the time goes (Nsight Compute's stall samples at batch 64, 32 x 1; benchmarks/gpu/stalls.sh, H100,
    session 59): 246 registers, so 8 warps an SM (12.5% occupancy), 6.5 cycles a warp between issues, 19.8 M warp
    instructions (47% FFMA: the three passes over the tile). 58% of the samples wait on global loads; 29% at one
    instruction, the first use of a loaded bf16 vector (its layout change through shared memory), whose load
    follows the tile's 16 KB: a program's first round trip, with the SM's other 7 warps its only cover."""
    pdl_entry(PDL)
    row, hd, vb = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    s, valid, n = pending_row(slot_ptr, n_ptr, row, s_n, P)
    kk, k_ok, vv, v_ok, tile, ssm_tile, h = state_tile(ssm_ptr, s, hd, vb, valid, s_ss, s_sh, s_sk, s_sv, K, V,
                                                       BK, BV)
    _verify_tile(h, s, valid, n, row, hd, kk, k_ok, vv, v_ok, tile, ssm_tile,
                 q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, o_ptr, pk_ptr, pg_ptr, pv_ptr, pb_ptr,
                 scale, s_qb, s_qt, s_qh, s_kib, s_kit, s_kih, s_vib, s_vit, s_vih, s_gib, s_git, s_gih, s_bib,
                 s_bit, s_bih, s_ks, s_kp, s_kh, s_kk, s_gs, s_gp, s_gh, s_gk, s_vs, s_vp, s_vh, s_vv, s_bs, s_bp,
                 s_bh, T, H, K, V, BK, L2NORM, RAW_GATE)


@triton.jit
def _kda_pending_kernel(
    k_ptr, g_ptr, v_ptr, beta_ptr, alog_ptr, dtb_ptr, pk_ptr, pg_ptr, pv_ptr, pb_ptr, slot_ptr,
    s_kib, s_kit, s_kih, s_vib, s_vit, s_vih, s_gib, s_git, s_gih, s_bib, s_bit, s_bih,
    s_ks, s_kp, s_kh, s_kk,
    s_gs, s_gp, s_gh, s_gk,
    s_vs, s_vp, s_vh, s_vv,
    s_bs, s_bp, s_bh,
    T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BVF: tl.constexpr,
    L2NORM: tl.constexpr, RAW_GATE: tl.constexpr, PDL: tl.constexpr,
):
    """pend_*[slot, :T−1] <- new tokens 1..T−1 (keys normalised, and with RAW_GATE g and β computed, as in the
    verify kernel)."""
    pdl_entry(PDL)
    row, hd = tl.program_id(0).to(tl.int64), tl.program_id(1)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    valid = slot >= 0
    s = tl.maximum(slot, 0)
    kk = tl.arange(0, BK)
    k_ok = kk < K
    vv = tl.arange(0, BVF)
    v_ok = vv < V
    B_DTYPE: tl.constexpr = beta_ptr.dtype.element_ty
    if RAW_GATE:
        neg_A = -tl.exp(tl.load(alog_ptr + hd).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hd * K + kk, mask=k_ok, other=0.0).to(tl.float32)
    for t in tl.static_range(1, T):
        k_t = tl.load(k_ptr + row * s_kib + t * s_kit + hd * s_kih + kk, mask=k_ok, other=0.0).to(tl.float32)
        if L2NORM:
            k_t = key_l2norm(k_t, True)
        g_t = tl.load(g_ptr + row * s_gib + t * s_git + hd * s_gih + kk, mask=k_ok, other=0.0)
        v_t = tl.load(v_ptr + row * s_vib + t * s_vit + hd * s_vih + vv, mask=v_ok, other=0.0)
        b_t = tl.load(beta_ptr + row * s_bib + t * s_bit + hd * s_bih)
        if RAW_GATE:
            g_t, b_t = kda_raw_gate(g_t.to(tl.float32), b_t.to(tl.float32), neg_A, dt_bias, B_DTYPE)
        tl.store(pv_ptr + s * s_vs + (t - 1) * s_vp + hd * s_vh + vv * s_vv, v_t.to(pv_ptr.dtype.element_ty),
                 mask=v_ok & valid)
        tl.store(pk_ptr + s * s_ks + (t - 1) * s_kp + hd * s_kh + kk * s_kk, k_t.to(pk_ptr.dtype.element_ty),
                 mask=k_ok & valid)
        tl.store(pg_ptr + s * s_gs + (t - 1) * s_gp + hd * s_gh + kk * s_gk, g_t.to(pg_ptr.dtype.element_ty),
                 mask=k_ok & valid)
        tl.store(pb_ptr + s * s_bs + (t - 1) * s_bp + hd * s_bh, b_t.to(pb_ptr.dtype.element_ty), mask=valid)


def kda_verify_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor | None,
    ssm: Tensor,
    pend_k: Tensor,
    pend_g: Tensor,
    pend_v: Tensor,
    pend_beta: Tensor,
    pend_n: Tensor,
    slots: Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    block_v: int | None = None,
    num_warps: int | None = None,
    *,
    gate: KDARawGate | None = None,
) -> Tensor:
    """`kda_verify` in two launches (the second writes the pending drafts); same arguments, writes and result.

    q, k, g [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; ssm [S, H, K, V] fp32; pend_k, pend_g [S, P, H, K];
    pend_v [S, P, H, V]; pend_beta [S, P, H]; pend_n [S] (read only); slots [B], negative = padding.
    The pool roles may be strided views. `gate` (g and beta None): g_raw [B, T, H, K], b [B, T, H], A_log (H
    elements), dt_bias (H·K elements); both launches compute g and beta, the same values as `gate.values()`.
    Returns o [B, T, H, V] in v's dtype (zeros for padding rows).
    """
    B, T, H, K = q.shape
    V, P = v.shape[3], pend_k.shape[1]
    if gate is not None:
        assert g is None and beta is None, "pass g and beta, or gate=, not both"
        g, beta = gate.g_raw, gate.b  # read by the kernels where g, beta would be
        A_log, dt_bias = gate.A_log.reshape(-1).contiguous(), gate.dt_bias.reshape(-1).contiguous()
        assert A_log.numel() == H and dt_bias.numel() == H * K, "A_log [H], dt_bias [H·K]"
    else:
        A_log = dt_bias = slots  # unused
    assert g.shape == (B, T, H, K) and beta.shape == (B, T, H), f"g {tuple(g.shape)} [B, T, H, K], beta [B, T, H]"
    assert T - 1 <= P, f"a verify step of {T} tokens needs pending caches for {T - 1} drafts, have {P}"
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if B == 0 or T == 0:
        return o
    q, k, v, g = unit_last(q), unit_last(k), unit_last(v), unit_last(g)
    slots = slots.contiguous()
    inputs = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *g.stride()[:3], *beta.stride()[:3])
    args = (
        q, k, v, g, beta, A_log, dt_bias, o,
        ssm, pend_k, pend_g, pend_v, pend_beta, pend_n, slots,
        K ** -0.5 if scale is None else scale,
        *inputs,
        *ssm.stride(), *pend_k.stride(), *pend_g.stride(), *pend_v.stride(), *pend_beta.stride(), pend_n.stride(0),
    )
    shapes = dict(T=T, H=H, K=K, V=V, P=P, L2NORM=use_qk_l2norm_in_kernel, RAW_GATE=gate is not None)
    if CLOSED_FORM and T > 1:
        assert P + T < 64, f"the closed form takes sequences of up to 63 rows, have {P} drafts + {T} tokens"
        BK, BV = verify_tile_sizes(K, V, block_v, B * H, q.device, closed.BLOCK_V)
        BV = max(16, BV)  # a product's least width (columns past V masked)
        nvb = triton.cdiv(V, BV)
        closed._kda_verify_closed_kernel[(B, H, nvb)](
            *args, **shapes, BK=BK, BV=BV, NVB=nvb, SEQ=max(8, triton.next_power_of_2(P + T + 1)),
            PRECISION="tf32x3" if v.dtype == torch.float32 else "tf32", num_warps=num_warps or closed.NUM_WARPS,
            **pdl_launch(q))
    else:
        BK, BV = verify_tile_sizes(K, V, block_v, B * H, q.device)
        nvb = triton.cdiv(V, BV)
        _kda_verify_kernel[(B, H, nvb)](*args, **shapes, BK=BK, BV=BV, NVB=nvb,
                                        num_warps=num_warps or verify_warps(T), **pdl_launch(q))
    if T > 1:  # after the first launch has read the old entries
        _kda_pending_kernel[(B, H)](
            k, g, v, beta, A_log, dt_bias, pend_k, pend_g, pend_v, pend_beta, slots,
            *inputs[3:],
            *pend_k.stride(), *pend_g.stride(), *pend_v.stride(), *pend_beta.stride(),
            T=T, H=H, K=K, V=V, BK=BK, BVF=triton.next_power_of_2(V), L2NORM=use_qk_l2norm_in_kernel,
            RAW_GATE=gate is not None, **pdl_launch(k),
        )
    return o
