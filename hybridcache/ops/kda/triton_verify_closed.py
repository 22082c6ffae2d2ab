"""KDA's verify with pending drafts in closed form, one Triton launch in place of `triton_verify.py`'s first
(same grid, reads and writes; its second launch still writes the pending drafts).

A program (row, head, value block) puts the accepted pending drafts and the T new tokens in rows of one
sequence: rows [0, P) hold the pending slots (a slot at or past pend_n is an identity step: g = 0, β = 0, so
u = 0), rows [P, P + T) the new tokens. With Γ_r [K] = g_0 + … + g_r (per key channel) and h the checkpoint:
  u_r = β_r·(v_r − hᵀ(e^{Γ_r} ⊙ k_r) − Σ_{s<r} A_rs·u_s),   A_rs = Σ_i k_ri·k_si·e^{Γ_ri − Γ_si}
  o_r = hᵀ(e^{Γ_r} ⊙ q_r) + Σ_{s≤r} Q_rs·u_s,             Q_rs = Σ_i q_ri·k_si·e^{Γ_ri − Γ_si}
  checkpoint after the first new token = e^{Γ_P} ⊙ h + Σ_{s≤P} (k_s ⊙ e^{Γ_P − Γ_s})·u_sᵀ
the recurrence h_r = e^{g_r} ⊙ h_{r−1} + k_r·u_rᵀ, o_r = h_rᵀq_r unrolled; every e^{·} taken has a
non-positive exponent (g <= 0), so nothing overflows. The tile is read once and written once; every
product over it is a tf32x3 dot (fp32's accuracy: the checkpoint is fp32 state). Not yet timed against the
token-by-token kernel (`kda_verify_triton(closed_form=True)`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..delta_rule_triton import kda_raw_gate
from ..delta_rule_verify_triton import l2normed, pending_row, row_squares, state_tile
from ..token_rows_triton import token_row

# Compiled for sm_90 at kimi_linear 1B's shapes (batch 64, T = 4, 3 drafts pending): 255 registers a thread at
# 32 value columns and 8 warps, no spills (4 warps: 36 bytes spilled); [R, BK] fp32 rows are the bulk.
BLOCK_V = 32
NUM_WARPS = 8


@triton.jit
def _rows(ptr, rows, ok, s_r, cols, cols_ok, s_c):
    """Rows [R, W] fp32 at ptr + rows·s_r + cols·s_c where ok (zeros elsewhere)."""
    x = tl.load(ptr + rows[:, None] * s_r + cols[None, :] * s_c, mask=ok[:, None] & cols_ok[None, :], other=0.0)
    return x.to(tl.float32)


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
    T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, P: tl.constexpr, R: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, RAW_GATE: tl.constexpr,
):
    """`triton_verify._kda_verify_kernel`'s arguments; R >= max(16, P + T) rows (a dot's least size)."""
    row, hd, vb = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    s, valid, n = pending_row(slot_ptr, n_ptr, row, s_n, P)
    kk, k_ok, vv, v_ok, tile, ssm_tile, h = state_tile(ssm_ptr, s, hd, vb, valid, s_ss, s_sh, s_sk, s_sv, K, V, BK, BV)

    rows = tl.arange(0, R)
    pend = rows < n
    new = (rows >= P) & (rows < P + T)
    t = tl.maximum(rows - P, 0)  # the new token a row holds
    k_rows = _rows(pk_ptr + s * s_ks + hd * s_kh, rows, pend, s_kp, kk, k_ok, s_kk)
    g_rows = _rows(pg_ptr + s * s_gs + hd * s_gh, rows, pend, s_gp, kk, k_ok, s_gk)
    v_rows = _rows(pv_ptr + s * s_vs + hd * s_vh, rows, pend, s_vp, vv, v_ok, s_vv)
    b_rows = tl.load(pb_ptr + s * s_bs + hd * s_bh + rows * s_bp, mask=pend, other=0.0).to(tl.float32)
    k_new = _rows(k_ptr + row * s_kib + hd * s_kih, t, new, s_kit, kk, k_ok, 1)
    q_new = _rows(q_ptr + row * s_qb + hd * s_qh, t, new, s_qt, kk, k_ok, 1)
    g_new = _rows(g_ptr + row * s_gib + hd * s_gih, t, new, s_git, kk, k_ok, 1)
    b_new = tl.load(beta_ptr + row * s_bib + hd * s_bih + t * s_bit, mask=new, other=0.0).to(tl.float32)
    if RAW_GATE:  # g and β of the new rows only: a row of zeros stays an identity step
        B_DTYPE: tl.constexpr = beta_ptr.dtype.element_ty
        neg_A = -tl.exp(tl.load(alog_ptr + hd).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hd * K + kk, mask=k_ok, other=0.0).to(tl.float32)
        g_raw, b_raw = kda_raw_gate(g_new, b_new, neg_A, dt_bias[None, :], B_DTYPE)
        g_new = tl.where(new[:, None], g_raw, 0.0)
        b_new = tl.where(new, b_raw, 0.0)
    if L2NORM:  # `key_l2norm`'s KDA form, row by row
        k_new = l2normed(k_new, row_squares(k_new)[:, None], True)
        q_new = l2normed(q_new, row_squares(q_new)[:, None], True)
    k_rows += k_new
    g_rows += g_new
    v_rows += _rows(v_ptr + row * s_vib + hd * s_vih, t, new, s_vit, vv, v_ok, 1)
    b_rows += b_new
    q_rows = q_new * scale

    gam = tl.cumsum(g_rows, 0)  # [R, BK]
    e_gam = tl.exp(gam)
    hk = tl.dot(k_rows * e_gam, h, input_precision="tf32x3")  # row r: hᵀ(e^{Γ_r} ⊙ k_r)
    hq = tl.dot(q_rows * e_gam, h, input_precision="tf32x3")
    A = tl.zeros([R, R], dtype=tl.float32)
    Q = tl.zeros([R, R], dtype=tl.float32)
    for c in tl.static_range(P + T):  # column c of A and Q
        k_c = token_row(k_rows, rows, c)
        decay = tl.where((rows >= c)[:, None], tl.exp(gam - token_row(gam, rows, c)[None, :]), 0.0)
        A = tl.where((rows == c)[None, :], tl.sum(k_rows * (k_c[None, :] * decay), 1)[:, None], A)
        Q = tl.where((rows == c)[None, :], tl.sum(q_rows * (k_c[None, :] * decay), 1)[:, None], Q)
    coef = tl.where(rows[None, :] < rows[:, None], b_rows[:, None] * A, 0.0)
    rhs = b_rows[:, None] * (v_rows - hk)
    u = tl.zeros([R, BV], dtype=tl.float32)
    for r in tl.static_range(P + T):
        u_r = token_row(rhs, rows, r) - tl.sum(token_row(coef, rows, r)[:, None] * u, 0)
        u = tl.where((rows == r)[:, None], u_r[None, :], u)
    o = hq + tl.dot(Q, u, input_precision="tf32x3")
    o_rows = o_ptr + ((row * T + t[:, None]) * H + hd) * V + vv[None, :]
    tl.store(o_rows, tl.where(valid, o, 0.0).to(o_ptr.dtype.element_ty), mask=new[:, None] & v_ok[None, :])

    # the checkpoint after the first new token (row P)
    gam_P = token_row(gam, rows, P)
    w = tl.where((rows <= P)[:, None], k_rows * tl.exp(gam_P[None, :] - gam), 0.0)
    h = h * tl.exp(gam_P)[:, None] + tl.dot(tl.trans(w), u, input_precision="tf32x3")
    tl.store(ssm_tile, h, mask=tile & valid)
