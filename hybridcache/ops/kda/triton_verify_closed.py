"""KDA's verify with pending drafts in closed form: the first of `triton_verify.py`'s two launches (same work
split, reads and writes; the pending kernel there still writes the new drafts), with the state touched only by
products and one scaling.

A program (row, head, value block) takes the row's n accepted pending drafts and its T new tokens as one
sequence of L = n + T rows (r < n: draft r; else new token r − n), each with a key k_r, a log decay per key row
g_r, a value v_r and β_r (a new token's query q_r; none for a draft). With Γ_r = g_0 + … + g_r per key row, the
token-by-token recurrence h_r = e^{g_r}⊙h_{r−1} + k_r·u_rᵀ, u_r = β_r·(v_r − (e^{g_r}⊙h_{r−1})ᵀk_r), o_r = h_rᵀq_r
unrolls to
  u_r = β_r·(v_r − h₀ᵀ(e^{Γ_r}⊙k_r) − Σ_{s<r} (Σ_d k_r·k_s·e^{Γ_r−Γ_s})·u_s)       (solved forward over r)
  o_r = h₀ᵀ(e^{Γ_r}⊙q_r) + Σ_{s≤r} (Σ_d q_r·k_s·e^{Γ_r−Γ_s})·u_s
  h after new token 0 (row n, the state stored) = e^{Γ_n}⊙h₀ + Σ_{s≤n} (e^{Γ_n−Γ_s}⊙k_s)·u_sᵀ.
The decays between rows are taken per key row (e^{Γ_r−Γ_s} only where s <= r), never split into e^{Γ_r}·e^{−Γ_s},
which overflows for strong decays; that work is [rows, K] a pair of rows, independent of the state. The state
itself meets two products with the rows (tensor cores), one scaling and one product for the stored state: the
token-by-token kernel's four passes over the tile a row are what bound it (it takes twice decode's time for the
same bytes).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..delta_rule_triton import kda_raw_gate
from ..pdl_triton import pdl_entry
from ..token_rows_triton import token_row

BLOCK_V = 32  # value columns a program, by default (a product needs 16 or more; sm_90: 255 registers, no spills)
NUM_WARPS = 4


@triton.jit
def _kda_verify_closed_kernel(
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
    T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, P: tl.constexpr, LP: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, RAW_GATE: tl.constexpr,
    PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    """As `_kda_verify_kernel` (same arguments); LP >= 16 rows cover a sequence's P + T."""
    pdl_entry(PDL)
    row, hd, vb = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    valid = slot >= 0
    s = tl.maximum(slot, 0)
    n = tl.minimum(tl.maximum(tl.where(valid, tl.load(n_ptr + s * s_n), 0), 0), P)
    kk = tl.arange(0, BK)
    k_ok = kk < K
    vv = vb * BV + tl.arange(0, BV)
    v_ok = vv < V
    rows = tl.arange(0, LP)
    length = n + T
    is_pend = rows < n
    tok = tl.maximum(rows - n, 0)
    is_new = (rows >= n) & (rows < length)

    # the sequence's rows: keys (new ones normalised), decays, values, β, queries (new tokens only)
    k_new = tl.load(k_ptr + row * s_kib + hd * s_kih + tok[:, None] * s_kit + kk[None, :],
                    mask=is_new[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
    q_all = tl.load(q_ptr + row * s_qb + hd * s_qh + tok[:, None] * s_qt + kk[None, :],
                    mask=is_new[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
    if L2NORM:  # `key_l2norm`'s KDA form, a row at a time
        k_new = k_new / tl.sqrt(tl.sum(k_new * k_new, 1) + 1e-6)[:, None]
        q_all = q_all / tl.sqrt(tl.sum(q_all * q_all, 1) + 1e-6)[:, None]
    q_all = q_all * scale
    k_pend = tl.load(pk_ptr + s * s_ks + hd * s_kh + rows[:, None] * s_kp + kk[None, :] * s_kk,
                     mask=is_pend[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
    k_all = tl.where(is_pend[:, None], k_pend, k_new)
    g_new = tl.load(g_ptr + row * s_gib + hd * s_gih + tok[:, None] * s_git + kk[None, :],
                    mask=is_new[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
    b_new = tl.load(beta_ptr + row * s_bib + hd * s_bih + tok * s_bit, mask=is_new, other=0.0).to(tl.float32)
    if RAW_GATE:
        B_DTYPE: tl.constexpr = beta_ptr.dtype.element_ty  # b's dtype, the raw gate rounds beta to it
        neg_A = -tl.exp(tl.load(alog_ptr + hd).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hd * K + kk, mask=k_ok, other=0.0).to(tl.float32)
        g_new, b_new = kda_raw_gate(g_new, b_new, neg_A, dt_bias[None, :], B_DTYPE)
        g_new = tl.where(is_new[:, None] & k_ok[None, :], g_new, 0.0)
        b_new = tl.where(is_new, b_new, 0.0)
    g_pend = tl.load(pg_ptr + s * s_gs + hd * s_gh + rows[:, None] * s_gp + kk[None, :] * s_gk,
                     mask=is_pend[:, None] & k_ok[None, :], other=0.0)
    gam = tl.cumsum(tl.where(is_pend[:, None], g_pend, g_new), 0)  # Γ [LP, BK]
    b_pend = tl.load(pb_ptr + s * s_bs + hd * s_bh + rows * s_bp, mask=is_pend, other=0.0).to(tl.float32)
    b_all = tl.where(is_pend, b_pend, b_new)
    v_pend = tl.load(pv_ptr + s * s_vs + hd * s_vh + rows[:, None] * s_vp + vv[None, :] * s_vv,
                     mask=is_pend[:, None] & v_ok[None, :], other=0.0)
    v_new = tl.load(v_ptr + row * s_vib + hd * s_vih + tok[:, None] * s_vit + vv[None, :],
                    mask=is_new[:, None] & v_ok[None, :], other=0.0)
    v_all = tl.where(is_pend[:, None], v_pend.to(tl.float32), v_new.to(tl.float32))

    # between rows: (r, c) = Σ_d x_r·k_c·e^{Γ_r−Γ_c} for c <= r (x = k, strictly lower; x = q), and the stored
    # state's weights e^{Γ_n−Γ_c}⊙k_c (row n of column c's decayed keys: zero for c > n)
    cols = tl.arange(0, LP)
    kk_dec = tl.zeros([LP, LP], dtype=tl.float32)
    qk_dec = tl.zeros([LP, LP], dtype=tl.float32)
    w_store = tl.zeros([LP, BK], dtype=tl.float32)
    for c in range(0, length):
        later = rows >= c
        gam_c = token_row(gam, rows, c)
        decay = tl.where(later[:, None], tl.exp(tl.where(later[:, None], gam - gam_c[None, :], 0.0)), 0.0)
        k_dec = decay * token_row(k_all, rows, c)[None, :]
        kk_dec = tl.where(cols[None, :] == c, tl.where(rows > c, tl.sum(k_all * k_dec, 1), 0.0)[:, None], kk_dec)
        qk_dec = tl.where(cols[None, :] == c, tl.sum(q_all * k_dec, 1)[:, None], qk_dec)
        w_store = tl.where(rows[:, None] == c, token_row(k_dec, rows, n)[None, :], w_store)

    # the state: two products with the rows, then the u rows solved forward and the outputs
    tile = k_ok[:, None] & v_ok[None, :]
    ssm_tile = ssm_ptr + s * s_ss + hd * s_sh + kk[:, None] * s_sk + vv[None, :] * s_sv
    h0 = tl.load(ssm_tile, mask=tile & valid, other=0.0)
    e_gam = tl.exp(gam)
    # (r, v): h₀ᵀ(e^{Γ_r}⊙k_r), in fp32's accuracy: the u rows it gives go into the stored state
    hk = tl.dot(e_gam * k_all, h0, input_precision="tf32x3")
    hq = tl.dot(e_gam * q_all, h0, input_precision=PRECISION)
    rhs = b_all[:, None] * (v_all - hk)
    coef = b_all[:, None] * kk_dec
    u_all = tl.zeros([LP, BV], dtype=tl.float32)
    for r in range(0, length):
        u_r = token_row(rhs, rows, r) - tl.sum(token_row(coef, rows, r)[:, None] * u_all, 0)
        u_all = tl.where((rows == r)[:, None], u_r[None, :], u_all)
    o_all = hq + tl.dot(qk_dec, u_all, input_precision=PRECISION)
    o_rows = o_ptr + ((row * T + tok[:, None]) * H + hd) * V + vv[None, :]
    tl.store(o_rows, tl.where(valid, o_all, 0.0).to(o_ptr.dtype.element_ty), mask=is_new[:, None] & v_ok[None, :])
    # the state after new token 0, in fp32's accuracy (tf32x3), as the token-by-token kernel stores it
    h_n = token_row(e_gam, rows, n)[:, None] * h0
    h_n = tl.dot(tl.trans(w_store), u_all, acc=h_n, input_precision="tf32x3")
    tl.store(ssm_tile, h_n, mask=tile & valid)
