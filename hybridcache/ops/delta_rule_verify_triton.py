"""Speculative verify of the gated delta rule as fused Triton kernels, reading and writing the pool's slots in
place (no gather, no scatter, no host sync, shapes known on the host: graph-capturable).

Same contracts as `gdn.replay.gdn_verify` (Gated DeltaNet, replay history) and `kda.verify.kda_verify` (KDA,
pending drafts); docs/layouts.md has the roles. Per value head, state h [K, V] fp32, one new token:
  h = exp(g)·h          (g one scalar per value head for GDN, one per key row for KDA)
  u = β·(v − hᵀk);  h = h + k·uᵀ;  o = hᵀ(q·scale)
which is the closed (WY) form of `gdn/block.py`: there u_t = β_t·(v_t − (exp(g_t)·h_{t−1})ᵀ·k_t), the same u.

Work split. One program takes one (batch row, value head, value block) and holds the [BK, BV] fp32 tile of
its state in registers; value columns are independent in the recurrence, so blocks never talk.
- GDN: tile = exp(G_last)·ssm[slot] + Σ_{j<p} k_j·(exp(G_last − G_j)·u_j)ᵀ, read from buffer b of the
  history one entry at a time (rank-1 updates over j < p, so nothing at or past p is read);
  stored back to ssm only when the row folds (p + T > HIST). Then the T new tokens; each writes its u slice;
  the V-block-0 program writes G (running from G_last, or from 0 after a fold) and β of its value head, and
  the V-block-0 program of the first value head of a key group writes the normalised key.
  No program reads what another writes: reads are [0, p) of buffer b, writes [p, p + T) of buffer b or
  [0, T) of buffer 1 − b.
- KDA: tile = ssm[slot], then the pend_n accepted drafts one by one, then the T new tokens; stored to ssm
  after new token 0. The new drafts (tokens 1..T−1) land where the old ones are read, [0, T − 1) against
  [0, pend_n), and pend_k, pend_g, pend_beta are shared by all value blocks of a head: no program of this
  launch may write them. A second, small launch (one program per row and head, after the first has read
  everything) writes pend_*[slot, :T−1]; it needs nothing from the first (the keys are normalised again).
Padding rows (slot < 0) load no state, store nothing and output zeros; every pool load is masked, never
multiplied by zero, so NaNs in unused slots or past p / pend_n cannot leak.
GDN's inputs are read through their strides (q, k, v with a unit last stride: column slices of the conv
output are read in place); with a raw gate (`gate=RawGate(a, b, A_log, dt_bias)`) the kernel reads a, b
where g, beta would be and computes them per token (`delta_rule_triton.gdn_raw_gate`), writing the same G and
β history. KDA likewise with `gate=KDARawGate(g_raw, b, A_log, dt_bias)` (`delta_rule_triton.kda_raw_gate`):
both of its launches compute g and β from g_raw and b, so pend_g and pend_beta hold the same values as with g,
β given.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from .delta_rule_triton import gdn_raw_gate, kda_raw_gate, unit_last

if TYPE_CHECKING:
    from .gdn.decode import RawGate
    from .kda.gate import KDARawGate

# Tiling measured on the H200 (benchmarks/tune_delta_rule.py, K = V = 128, T = 4): one warp per program, 32
# value columns, halved (not below 8) while the grid has under 4 programs per SM (batch 1: 8 columns).
BLOCK_V = 32
NUM_WARPS = 1
MIN_PROGRAMS_PER_SM = 4


@triton.jit
def _l2norm(x, KDA_FORM: tl.constexpr):
    """`x·rsqrt(Σx² + 1e-6)` (gdn/block.py) or `x / sqrt(Σx² + 1e-6)` (kda/block.py); padding lanes are 0."""
    if KDA_FORM:
        return x / tl.sqrt(tl.sum(x * x, 0) + 1e-6)
    return x * tl.rsqrt(tl.sum(x * x, 0) + 1e-6)


@triton.jit
def _gdn_verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, o_ptr,
    ssm_ptr, u_ptr, hk_ptr, hG_ptr, hb_ptr, pnat_ptr, buf_ptr, slot_ptr,
    scale,
    s_qb, s_qt, s_qh, s_kib, s_kit, s_kih, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_bib, s_bit, s_bih,
    s_ss, s_sh, s_sk, s_sv,
    s_us, s_ub, s_ut, s_uh, s_uv,
    s_ks, s_kb, s_kt, s_kh, s_kk,
    s_Gs, s_Gb, s_Gh, s_Gt,
    s_bs, s_bb, s_bh, s_bt,
    s_pnat, s_buf,
    T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, HIST: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, RAW_GATE: tl.constexpr,
):
    """Inputs q, k, v, g, beta [B, T, heads, ...] by their strides (s_q*, s_ki*, s_v*, s_g*, s_bi*; unit last);
    RAW_GATE: g_ptr and beta_ptr hold the gate's raw a, b, alog_ptr and dtb_ptr A_log, dt_bias [HV]."""
    row, hv, vb = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    hk = hv // (HV // H)  # key head of value head hv
    slot = tl.load(slot_ptr + row).to(tl.int64)
    valid = slot >= 0
    s = tl.maximum(slot, 0)
    p = tl.where(valid, tl.load(pnat_ptr + s * s_pnat), 0)
    p = tl.minimum(tl.maximum(p, 0), HIST)
    b = tl.load(buf_ptr + s * s_buf).to(tl.int64)
    fold = p + T > HIST

    kk = tl.arange(0, BK)
    k_ok = kk < K
    vv = vb * BV + tl.arange(0, BV)
    v_ok = vv < V
    tile = k_ok[:, None] & v_ok[None, :]
    ssm_tile = ssm_ptr + s * s_ss + hv * s_sh + kk[:, None] * s_sk + vv[None, :] * s_sv
    h = tl.load(ssm_tile, mask=tile & valid, other=0.0).to(tl.float32)

    # effective state: checkpoint plus history [0, p) of buffer b
    G_row = hG_ptr + s * s_Gs + b * s_Gb + hv * s_Gh
    u_row = u_ptr + s * s_us + b * s_ub + hv * s_uh
    k_row = hk_ptr + s * s_ks + b * s_kb + hk * s_kh
    G_last = tl.load(G_row + (p - 1) * s_Gt, mask=p > 0, other=0.0).to(tl.float32)
    h = h * tl.exp(G_last)
    for j in range(0, p):  # rank-1 updates: p <= HIST is small, and no dot layouts to convert between
        w = tl.exp(G_last - tl.load(G_row + j * s_Gt).to(tl.float32))
        u_j = tl.load(u_row + j * s_ut + vv * s_uv, mask=v_ok, other=0.0).to(tl.float32)
        k_j = tl.load(k_row + j * s_kt + kk * s_kk, mask=k_ok, other=0.0).to(tl.float32)
        h += k_j[:, None] * (w * u_j)[None, :]
    tl.store(ssm_tile, h, mask=tile & valid & fold)

    # the new tokens: [p, p + T) of buffer b, or [0, T) of buffer 1 - b after a fold
    nb = tl.where(fold, 1 - b, b)
    pos0 = tl.where(fold, 0, p)
    G = tl.where(fold, 0.0, G_last)
    writes_shared = valid & (vb == 0)
    writes_key = writes_shared & (hv % (HV // H) == 0)
    q_row = q_ptr + row * s_qb + hk * s_qh
    k_in = k_ptr + row * s_kib + hk * s_kih
    v_row = v_ptr + row * s_vb + hv * s_vh
    g_in = g_ptr + row * s_gb + hv * s_gh
    b_in = beta_ptr + row * s_bib + hv * s_bih
    B_DTYPE: tl.constexpr = beta_ptr.dtype.element_ty  # b's dtype, the raw gate rounds beta to it
    if RAW_GATE:
        neg_A = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    for t in tl.static_range(T):
        tok = row * T + t
        q_t = tl.load(q_row + t * s_qt + kk, mask=k_ok, other=0.0).to(tl.float32)
        k_t = tl.load(k_in + t * s_kit + kk, mask=k_ok, other=0.0).to(tl.float32)
        if L2NORM:
            q_t = _l2norm(q_t, False)
            k_t = _l2norm(k_t, False)
        q_t = q_t * scale
        v_t = tl.load(v_row + t * s_vt + vv, mask=v_ok, other=0.0).to(tl.float32)
        g_t = tl.load(g_in + t * s_gt).to(tl.float32)
        b_t = tl.load(b_in + t * s_bit).to(tl.float32)
        if RAW_GATE:
            g_t, b_t = gdn_raw_gate(g_t, b_t, neg_A, dt_bias, B_DTYPE)
        h = h * tl.exp(g_t)
        u_t = b_t * (v_t - tl.sum(h * k_t[:, None], 0))
        h += k_t[:, None] * u_t[None, :]
        o_t = tl.where(valid, tl.sum(h * q_t[:, None], 0), 0.0)
        tl.store(o_ptr + (tok * HV + hv) * V + vv, o_t.to(o_ptr.dtype.element_ty), mask=v_ok)
        G += g_t
        pos = pos0 + t
        tl.store(u_ptr + s * s_us + nb * s_ub + pos * s_ut + hv * s_uh + vv * s_uv,
                 u_t.to(u_ptr.dtype.element_ty), mask=v_ok & valid)
        tl.store(hk_ptr + s * s_ks + nb * s_kb + pos * s_kt + hk * s_kh + kk * s_kk,
                 k_t.to(hk_ptr.dtype.element_ty), mask=k_ok & writes_key)
        tl.store(hG_ptr + s * s_Gs + nb * s_Gb + hv * s_Gh + pos * s_Gt, G.to(hG_ptr.dtype.element_ty),
                 mask=writes_shared)
        tl.store(hb_ptr + s * s_bs + nb * s_bb + hv * s_bh + pos * s_bt, b_t.to(hb_ptr.dtype.element_ty),
                 mask=writes_shared)


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
    BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, RAW_GATE: tl.constexpr,
):
    """q, k, g, v, beta [B, T, H, ...] by their strides (s_q*, s_ki*, s_vi*, s_gi*, s_bi*; unit last);
    RAW_GATE: g_ptr and beta_ptr hold the raw g_raw, b, alog_ptr and dtb_ptr A_log [H], dt_bias [H·K]."""
    row, hd, vb = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    valid = slot >= 0
    s = tl.maximum(slot, 0)
    n = tl.where(valid, tl.load(n_ptr + s * s_n), 0)
    n = tl.minimum(tl.maximum(n, 0), P)

    kk = tl.arange(0, BK)
    k_ok = kk < K
    vv = vb * BV + tl.arange(0, BV)
    v_ok = vv < V
    tile = k_ok[:, None] & v_ok[None, :]
    ssm_tile = ssm_ptr + s * s_ss + hd * s_sh + kk[:, None] * s_sk + vv[None, :] * s_sv
    h = tl.load(ssm_tile, mask=tile & valid, other=0.0).to(tl.float32)

    # the accepted pending drafts [0, pend_n)
    for j in range(0, n):
        k_j = tl.load(pk_ptr + s * s_ks + j * s_kp + hd * s_kh + kk * s_kk, mask=k_ok, other=0.0).to(tl.float32)
        g_j = tl.load(pg_ptr + s * s_gs + j * s_gp + hd * s_gh + kk * s_gk, mask=k_ok, other=0.0).to(tl.float32)
        v_j = tl.load(pv_ptr + s * s_vs + j * s_vp + hd * s_vh + vv * s_vv, mask=v_ok, other=0.0).to(tl.float32)
        b_j = tl.load(pb_ptr + s * s_bs + j * s_bp + hd * s_bh).to(tl.float32)
        h = h * tl.exp(g_j)[:, None]
        u_j = b_j * (v_j - tl.sum(h * k_j[:, None], 0))
        h += k_j[:, None] * u_j[None, :]

    B_DTYPE: tl.constexpr = beta_ptr.dtype.element_ty  # b's dtype, the raw gate rounds beta to it
    if RAW_GATE:
        neg_A = -tl.exp(tl.load(alog_ptr + hd).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hd * K + kk, mask=k_ok, other=0.0).to(tl.float32)
    for t in tl.static_range(T):
        tok = row * T + t
        q_t = tl.load(q_ptr + row * s_qb + t * s_qt + hd * s_qh + kk, mask=k_ok, other=0.0).to(tl.float32)
        k_t = tl.load(k_ptr + row * s_kib + t * s_kit + hd * s_kih + kk, mask=k_ok, other=0.0).to(tl.float32)
        if L2NORM:
            q_t = _l2norm(q_t, True)
            k_t = _l2norm(k_t, True)
        q_t = q_t * scale
        g_t = tl.load(g_ptr + row * s_gib + t * s_git + hd * s_gih + kk, mask=k_ok, other=0.0).to(tl.float32)
        v_t = tl.load(v_ptr + row * s_vib + t * s_vit + hd * s_vih + vv, mask=v_ok, other=0.0).to(tl.float32)
        b_t = tl.load(beta_ptr + row * s_bib + t * s_bit + hd * s_bih).to(tl.float32)
        if RAW_GATE:
            g_t, b_t = kda_raw_gate(g_t, b_t, neg_A, dt_bias, B_DTYPE)
        h = h * tl.exp(g_t)[:, None]
        u_t = b_t * (v_t - tl.sum(h * k_t[:, None], 0))
        h += k_t[:, None] * u_t[None, :]
        o_t = tl.where(valid, tl.sum(h * q_t[:, None], 0), 0.0)
        tl.store(o_ptr + (tok * H + hd) * V + vv, o_t.to(o_ptr.dtype.element_ty), mask=v_ok)
        if t == 0:
            tl.store(ssm_tile, h, mask=tile & valid)


@triton.jit
def _kda_pending_kernel(
    k_ptr, g_ptr, v_ptr, beta_ptr, alog_ptr, dtb_ptr, pk_ptr, pg_ptr, pv_ptr, pb_ptr, slot_ptr,
    s_kib, s_kit, s_kih, s_vib, s_vit, s_vih, s_gib, s_git, s_gih, s_bib, s_bit, s_bih,
    s_ks, s_kp, s_kh, s_kk,
    s_gs, s_gp, s_gh, s_gk,
    s_vs, s_vp, s_vh, s_vv,
    s_bs, s_bp, s_bh,
    T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BVF: tl.constexpr,
    L2NORM: tl.constexpr, RAW_GATE: tl.constexpr,
):
    """pend_*[slot, :T−1] <- new tokens 1..T−1 (keys normalised, and with RAW_GATE g and β computed, as in the
    verify kernel)."""
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
            k_t = _l2norm(k_t, True)
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


def _tile_sizes(K: int, V: int, block_v: int | None, rows: int, device: torch.device) -> tuple[int, int]:
    """BK covers K (the norms and hᵀk need the whole key); BV = block_v, or BLOCK_V halved down to 8 while
    `rows` (batch x value heads) x ⌈V / BV⌉ programs give under MIN_PROGRAMS_PER_SM per SM."""
    bv = min(block_v or BLOCK_V, max(8, triton.next_power_of_2(V)))
    if block_v is None and device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        while bv > 8 and rows * triton.cdiv(V, bv) < MIN_PROGRAMS_PER_SM * sms:
            bv //= 2
    return max(16, triton.next_power_of_2(K)), bv


def gdn_verify_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    ssm: Tensor,
    replay_u: Tensor,
    replay_k: Tensor,
    replay_G: Tensor,
    replay_beta: Tensor,
    pnat: Tensor,
    buf_idx: Tensor,
    slots: Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    block_v: int | None = None,
    num_warps: int = NUM_WARPS,
    *,
    gate: RawGate | None = None,
) -> Tensor:
    """`gdn_verify` in one launch; same arguments, writes and result (`block_v`, `num_warps`: the tiling,
    which does not change the result).

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; ssm [S, HV, K, V] fp32;
    replay_u [S, 2, HIST, HV, V]; replay_k [S, 2, HIST, H, K]; replay_G, replay_beta [S, 2, HV, HIST];
    pnat, buf_idx [S] int32 (read only); slots [B], negative = padding. The pool roles may be strided views;
    so may q, k, v (copied only without a unit last stride), g and beta (any strides).
    `gate` (g and beta None): a, b [B, T, HV] (any strides), A_log, dt_bias [HV]; g and beta are computed
    in the kernel, the same values as `gate.values()`.
    Returns o [B, T, HV, V] in v's dtype (zeros for padding rows).
    """
    B, T, H, K = q.shape
    HV, V, hist = v.shape[2], v.shape[3], replay_u.shape[2]
    assert T <= hist, f"a verify step of {T} tokens needs HIST >= {T}, have {hist}"
    assert HV % H == 0, f"value heads ({HV}) must be a multiple of key heads ({H})"
    if gate is not None:
        assert g is None and beta is None, "pass g and beta, or gate=, not both"
        g, beta = gate.a, gate.b  # read by the kernel where g, beta would be
        A_log, dt_bias = gate.A_log.contiguous(), gate.dt_bias.contiguous()
        assert A_log.shape == dt_bias.shape == (HV,), "A_log, dt_bias [HV]"
    else:
        A_log = dt_bias = slots  # unused
    assert g.shape == beta.shape == (B, T, HV), f"g, beta {tuple(g.shape)}, {tuple(beta.shape)}: [B, T, HV]"
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if B == 0 or T == 0:
        return o
    q, k, v = unit_last(q), unit_last(k), unit_last(v)
    BK, BV = _tile_sizes(K, V, block_v, B * HV, q.device)
    _gdn_verify_kernel[(B, HV, triton.cdiv(V, BV))](
        q, k, v, g, beta, A_log, dt_bias, o,
        ssm, replay_u, replay_k, replay_G, replay_beta, pnat, buf_idx, slots.contiguous(),
        K ** -0.5 if scale is None else scale,
        *(x.stride(i) for x in (q, k, v) for i in range(3)), *g.stride(), *beta.stride(),
        *ssm.stride(), *replay_u.stride(), *replay_k.stride(), *replay_G.stride(), *replay_beta.stride(),
        pnat.stride(0), buf_idx.stride(0),
        T=T, H=H, HV=HV, K=K, V=V, HIST=hist, BK=BK, BV=BV, L2NORM=use_qk_l2norm_in_kernel,
        RAW_GATE=gate is not None, num_warps=num_warps,
    )
    return o


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
    num_warps: int = NUM_WARPS,
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
    BK, BV = _tile_sizes(K, V, block_v, B * H, q.device)
    _kda_verify_kernel[(B, H, triton.cdiv(V, BV))](
        q, k, v, g, beta, A_log, dt_bias, o,
        ssm, pend_k, pend_g, pend_v, pend_beta, pend_n, slots,
        K ** -0.5 if scale is None else scale,
        *inputs,
        *ssm.stride(), *pend_k.stride(), *pend_g.stride(), *pend_v.stride(), *pend_beta.stride(), pend_n.stride(0),
        T=T, H=H, K=K, V=V, P=P, BK=BK, BV=BV, L2NORM=use_qk_l2norm_in_kernel, RAW_GATE=gate is not None,
        num_warps=num_warps,
    )
    if T > 1:  # after the first launch has read the old entries
        _kda_pending_kernel[(B, H)](
            k, g, v, beta, A_log, dt_bias, pend_k, pend_g, pend_v, pend_beta, slots,
            *inputs[3:],
            *pend_k.stride(), *pend_g.stride(), *pend_v.stride(), *pend_beta.stride(),
            T=T, H=H, K=K, V=V, BK=BK, BVF=triton.next_power_of_2(V), L2NORM=use_qk_l2norm_in_kernel,
            RAW_GATE=gate is not None,
        )
    return o
