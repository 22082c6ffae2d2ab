"""Gated DeltaNet's replay verify of T > 1 new tokens in closed form, one Triton launch: the work split, roles
and writes of `triton_verify.py` (`ops/delta_rule_verify_triton.py` has the split), with every step a product.

A program (row, value head, value block) loads everything it reads before it writes anything: its state tile,
the history [0, p) of buffer b, the new tokens' rows. The effective state is one product over the history
(checkpoint·e^{G_last} + K_histᵀ·(w ⊙ U_hist)), stored when the row folds; the new tokens then come out of
`_gdn_tokens_chunked` without ever updating the tile. Timed on an H100 against the token-by-token kernel at its
best tiling (benchmarks/tune_delta_rule.py, us at batch 1 / 16 / 64 / 256, T = 4, HIST 16, history half full):
7.7 / 36.2 / 126.7 / 470.1 at 32 value columns x 2 warps, against 9.7 / 34.6 / 154.9 / 556.0. The same loads and
history product with the tokens taken one by one were no faster (150.3 us at batch 64), nor was this kernel's
form at T = 1 (92.5 / 362.4 us at batch 64 / 256 against 92.5 / 330.8): there the token-by-token kernel stays.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..delta_rule_triton import gdn_raw_gate
from ..delta_rule_verify_triton import l2normed, replay_row, row_squares, state_tile
from ..token_rows_triton import token_row, token_value

BLOCK_V = 32
NUM_WARPS = 2


@triton.jit
def _gdn_tokens_chunked(h, q_all, k_all, v_all, g_all, b_all, q_ss, k_ss, scale, G0, rows, T: tl.constexpr,
                        L2NORM: tl.constexpr, PRECISION: tl.constexpr):
    """The T new tokens from state h [BK, BV] in closed form; rows [TP] (TP >= 16, a dot's least size) of
    q_all, k_all [TP, BK], v_all [TP, BV] and g_all, b_all [TP], zeros past T. With Γ_t = g_0 + … + g_t:
      u_t = β_t·(v_t − e^{Γ_t}·hᵀk_t − Σ_{s<t} e^{Γ_t−Γ_s}(k_s·k_t)·u_s)   (solved forward over t)
      o_t = e^{Γ_t}·hᵀq_t + Σ_{s≤t} e^{Γ_t−Γ_s}(k_s·q_t)·u_s
    the recurrence h_t = e^{g_t}·h_{t−1} + k_t·u_tᵀ, o_t = h_tᵀq_t unrolled. Products on the tensor cores in
    PRECISION: tf32x3 (fp32's accuracy) for fp32 inputs; tf32 (about 2^-11 a product) for 16-bit inputs, whose
    o and u are rounded to 16 bits (2^-8) after.
    -> o, u [TP, BV], the running G [TP] (from G0) and the normalised keys [TP, BK]."""
    qf = q_all.to(tl.float32)
    kf = k_all.to(tl.float32)
    if L2NORM:
        qf = l2normed(qf, q_ss[:, None], False)
        kf = l2normed(kf, k_ss[:, None], False)
    qf = qf * scale
    gam = tl.cumsum(g_all, 0)
    hk = tl.dot(kf, h, input_precision=PRECISION)  # row t: (hᵀk_t)ᵀ
    hq = tl.dot(qf, h, input_precision=PRECISION)
    kk = tl.dot(kf, tl.trans(kf), input_precision=PRECISION)  # (t, s): k_t·k_s
    qk = tl.dot(qf, tl.trans(kf), input_precision=PRECISION)  # (t, s): q_t·k_s
    earlier = rows[None, :] <= rows[:, None]  # (t, s): s <= t
    decay = tl.where(earlier, tl.exp(gam[:, None] - gam[None, :]), 0.0)  # e^{Γ_t−Γ_s} where s <= t, else 0
    e_gam = tl.exp(gam)
    rhs = b_all[:, None] * (v_all.to(tl.float32) - e_gam[:, None] * hk)
    coef = tl.where(rows[None, :] < rows[:, None], b_all[:, None] * decay * kk, 0.0)
    u_all = tl.zeros(rhs.shape, dtype=tl.float32)
    for t in tl.static_range(T):
        u_t = token_row(rhs, rows, t) - tl.sum(token_row(coef, rows, t)[:, None] * u_all, 0)
        u_all = tl.where((rows == t)[:, None], u_t[None, :], u_all)
    o_all = e_gam[:, None] * hq + tl.dot(decay * qk, u_all, input_precision=PRECISION)
    return o_all, u_all, G0 + gam, kf


@triton.jit
def _gdn_verify_chunked_kernel(
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
    T: tl.constexpr, TP: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    HIST: tl.constexpr, HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
    RAW_GATE: tl.constexpr, TOKEN_PRECISION: tl.constexpr,
):
    """Inputs q, k, v, g, beta [B, T, heads, ...] by their strides (s_q*, s_ki*, s_v*, s_g*, s_bi*; unit last);
    RAW_GATE: g_ptr and beta_ptr hold the gate's raw a, b, alog_ptr and dtb_ptr A_log, dt_bias [HV]."""
    row, hv, vb = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    hk = hv // (HV // H)  # key head of value head hv
    s, valid, p, b, fold = replay_row(slot_ptr, pnat_ptr, buf_ptr, row, s_pnat, s_buf, T, HIST)
    kk, k_ok, vv, v_ok, tile, ssm_tile, h = state_tile(ssm_ptr, s, hv, vb, valid, s_ss, s_sh, s_sk, s_sv, K, V, BK, BV)

    # Everything the program reads is loaded before anything it writes: the compiler cannot move a load past a
    # store to memory it may alias, so reads between writes would each cost a round trip to memory.
    G_row = hG_ptr + s * s_Gs + b * s_Gb + hv * s_Gh
    u_row = u_ptr + s * s_us + b * s_ub + hv * s_uh
    k_row = hk_ptr + s * s_ks + b * s_kb + hk * s_kh
    jj = tl.arange(0, HP)
    j_ok = jj < p
    G_hist = tl.load(G_row + jj * s_Gt, mask=j_ok, other=0.0).to(tl.float32)
    k_hist = tl.load(k_row + jj[:, None] * s_kt + kk[None, :] * s_kk, mask=j_ok[:, None] & k_ok[None, :], other=0.0)
    u_hist = tl.load(u_row + jj[:, None] * s_ut + vv[None, :] * s_uv, mask=j_ok[:, None] & v_ok[None, :], other=0.0)
    rows = tl.arange(0, TP)
    r_ok = rows < T
    q_all = tl.load(q_ptr + row * s_qb + hk * s_qh + rows[:, None] * s_qt + kk[None, :],
                    mask=r_ok[:, None] & k_ok[None, :], other=0.0)
    k_all = tl.load(k_ptr + row * s_kib + hk * s_kih + rows[:, None] * s_kit + kk[None, :],
                    mask=r_ok[:, None] & k_ok[None, :], other=0.0)
    v_all = tl.load(v_ptr + row * s_vb + hv * s_vh + rows[:, None] * s_vt + vv[None, :],
                    mask=r_ok[:, None] & v_ok[None, :], other=0.0)
    g_all = tl.load(g_ptr + row * s_gb + hv * s_gh + rows * s_gt, mask=r_ok, other=0.0).to(tl.float32)
    b_all = tl.load(beta_ptr + row * s_bib + hv * s_bih + rows * s_bit, mask=r_ok, other=0.0).to(tl.float32)
    if RAW_GATE:
        B_DTYPE: tl.constexpr = beta_ptr.dtype.element_ty  # b's dtype, the raw gate rounds beta to it
        neg_A = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
        g_all, b_all = gdn_raw_gate(g_all, b_all, neg_A, tl.load(dtb_ptr + hv).to(tl.float32), B_DTYPE)
    q_ss = row_squares(q_all)  # the rows' norms (used with L2NORM), the rows normalised where taken out
    k_ss = row_squares(k_all)

    # effective state: checkpoint plus history [0, p) of buffer b, one product over the history
    G_last = token_value(G_hist, jj, p - 1)  # -0.0 at p = 0
    w = tl.where(j_ok, tl.exp(G_last - G_hist), 0.0)
    h = h * tl.exp(G_last)
    # fp32 accuracy on tensor cores (three tf32 products): h is the checkpoint a fold stores
    h += tl.dot(tl.trans(k_hist.to(tl.float32)), u_hist.to(tl.float32) * w[:, None], input_precision="tf32x3")
    tl.store(ssm_tile, h, mask=tile & valid & fold)

    G = tl.where(fold, 0.0, G_last)
    o_all, u_all, G_all, k_all = _gdn_tokens_chunked(h, q_all, k_all, v_all, g_all, b_all, q_ss, k_ss, scale, G, rows,
                                                     T, L2NORM, TOKEN_PRECISION)

    # writes: outputs, and history [p, p + T) of buffer b, or [0, T) of buffer 1 - b after a fold
    nb = tl.where(fold, 1 - b, b)
    pos = tl.where(fold, 0, p) + rows
    writes_shared = valid & (vb == 0)
    writes_key = writes_shared & (hv % (HV // H) == 0)
    rv = r_ok[:, None] & v_ok[None, :]
    o_rows = o_ptr + ((row * T + rows[:, None]) * HV + hv) * V + vv[None, :]
    tl.store(o_rows, tl.where(valid, o_all, 0.0).to(o_ptr.dtype.element_ty), mask=rv)
    hist_b = s * s_us + nb * s_ub + hv * s_uh
    tl.store(u_ptr + hist_b + pos[:, None] * s_ut + vv[None, :] * s_uv, u_all.to(u_ptr.dtype.element_ty),
             mask=rv & valid)
    tl.store(hk_ptr + s * s_ks + nb * s_kb + hk * s_kh + pos[:, None] * s_kt + kk[None, :] * s_kk,
             k_all.to(hk_ptr.dtype.element_ty), mask=r_ok[:, None] & k_ok[None, :] & writes_key)
    tl.store(hG_ptr + s * s_Gs + nb * s_Gb + hv * s_Gh + pos * s_Gt, G_all.to(hG_ptr.dtype.element_ty),
             mask=r_ok & writes_shared)
    tl.store(hb_ptr + s * s_bs + nb * s_bb + hv * s_bh + pos * s_bt, b_all.to(hb_ptr.dtype.element_ty),
             mask=r_ok & writes_shared)
