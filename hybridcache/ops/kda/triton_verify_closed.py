"""KDA's verify with pending drafts in closed form, the state met only by products: the first of
`triton_verify.py`'s two launches (same work split, reads and writes; its pending kernel still writes the new
drafts). Off until timed (`triton_verify.CLOSED_FORM`).

A program (row, head, value block) takes the row's n accepted drafts and T new tokens as one sequence of rows
r < n + T (r < n: draft r; else new token r − n), each with a key k_r, a log decay per key row g_r, a value v_r,
β_r and a new token's query q_r. With Γ_r = g_0 + … + g_r per key row, the token-by-token recurrence unrolls to

    u_r = β_r·(v_r − h₀ᵀ(e^{Γ_r}⊙k_r) − Σ_{s<r} (Σ_d k_r·k_s·e^{Γ_r−Γ_s})·u_s)
    o_r = h₀ᵀ(e^{Γ_r}⊙q_r) + Σ_{s≤r} (Σ_d q_r·k_s·e^{Γ_r−Γ_s})·u_s
    h_n = e^{Γ_n}⊙h₀ + Σ_{s≤n} (e^{Γ_n−Γ_s}⊙k_s)·u_sᵀ                (the state after new token 0, stored)

Session 42's closed form (history cc76764) ran 3x slower than the token-by-token kernel on an H100. It took the
decays between rows as [16, K] exponentials a sequence row, pulled rows out of [16, K] tiles by reductions across
the program's warps, and solved the u rows one at a time, each step another such reduction. Here the rows are read
from memory one at a time in a static loop, and the decayed keys M (row s: k_s⊙e^{Γ_r−Γ_s}) are carried from row
to row by one multiply with e^{g_r}: no exponential beyond one a key row a token, and no row extracted from a
tile. The u rows come from one product with the inverse of the unit lower-triangular I + N (N nilpotent of
order SEQ: for 8, (I + N)⁻¹ = (I − N)(I + N²)(I + N⁴)), so no step waits on the one before. Every product that
reaches the stored state runs at fp32's accuracy (tf32x3).

The key and query norms (`key_l2norm`'s KDA form) come out of the same reduction as the row's pairs
(`_row_products`), so a row costs one reduction over the key rows.

Compiled for sm_90 at 32 value columns x 4 warps (benchmarks/sm90_compile.py, session 60): 255 registers, 40 bytes
spilled, and 81 barriers, 237 shared-memory stores and 290 loads in the SASS, against the token-by-token kernel's
29 barriers. Triton lays the row tiles out with the 4 warps side by side along K (its TTGIR: warpsPerCTA [1, 4]),
so each row's reduction crosses the warps through shared memory. Forms compiled on the way (barriers, spilled
bytes): four reductions a row (the two norms, the k and q products), 152, 16; the k and q products in one,
112, none; that with the decayed keys as SEQ rows rather than 2·SEQ, 114, none, 235 registers; the norms folded
in but the k and q products apart, 138, 44. Not yet timed (benchmarks/gpu/kda_closed.sh).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..delta_rule_triton import kda_raw_gate
from ..delta_rule_verify_triton import pending_row, state_tile
from ..pdl_triton import pdl_entry

NUM_WARPS = 4
BLOCK_V = 32  # value columns a program by default (a product needs 16 or more)


@triton.jit
def _sequence_row(r, n, row, s, hd, kk, k_ok, vv, v_ok, neg_A, dt_bias,
                  q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, pk_ptr, pg_ptr, pv_ptr, pb_ptr,
                  s_qb, s_qt, s_qh, s_kib, s_kit, s_kih, s_vib, s_vit, s_vih, s_gib, s_git, s_gih, s_bib, s_bit, s_bih,
                  s_ks, s_kp, s_kh, s_kk, s_gs, s_gp, s_gh, s_gk, s_vs, s_vp, s_vh, s_vv, s_bs, s_bp, s_bh,
                  T: tl.constexpr, RAW_GATE: tl.constexpr):
    """Row r of the sequence in fp32: (k, g, q [BK], v [BV], β), a new token's k and q as given (the loop
    normalises them); a draft's q is 0, and a row past n + T is all zeros (g = 0: no decay). Only the loads of
    the row's own kind are issued."""
    draft = r < n
    new = (r >= n) & (r < n + T)
    t = tl.maximum(r - n, 0)
    k = tl.load(pk_ptr + s * s_ks + r * s_kp + hd * s_kh + kk * s_kk, mask=k_ok & draft, other=0.0).to(tl.float32)
    g = tl.load(pg_ptr + s * s_gs + r * s_gp + hd * s_gh + kk * s_gk, mask=k_ok & draft, other=0.0).to(tl.float32)
    v = tl.load(pv_ptr + s * s_vs + r * s_vp + hd * s_vh + vv * s_vv, mask=v_ok & draft, other=0.0).to(tl.float32)
    b = tl.load(pb_ptr + s * s_bs + r * s_bp + hd * s_bh, mask=draft, other=0.0).to(tl.float32)
    k_new = tl.load(k_ptr + row * s_kib + t * s_kit + hd * s_kih + kk, mask=k_ok & new, other=0.0).to(tl.float32)
    q = tl.load(q_ptr + row * s_qb + t * s_qt + hd * s_qh + kk, mask=k_ok & new, other=0.0).to(tl.float32)
    g_new = tl.load(g_ptr + row * s_gib + t * s_git + hd * s_gih + kk, mask=k_ok & new, other=0.0).to(tl.float32)
    v_new = tl.load(v_ptr + row * s_vib + t * s_vit + hd * s_vih + vv, mask=v_ok & new, other=0.0).to(tl.float32)
    b_new = tl.load(beta_ptr + row * s_bib + t * s_bit + hd * s_bih, mask=new, other=0.0).to(tl.float32)
    if RAW_GATE:
        g_new, b_new = kda_raw_gate(g_new, b_new, neg_A, dt_bias, beta_ptr.dtype.element_ty)
        g_new = tl.where(k_ok & new, g_new, 0.0)
        b_new = tl.where(new, b_new, 0.0)
    return tl.where(draft, k, k_new), tl.where(draft, g, g_new), q, tl.where(draft, v, v_new), tl.where(draft, b, b_new)


@triton.jit
def _row_products(decayed, k, q, seq, r, new, L2NORM: tl.constexpr):
    """Row r's products with the decayed keys of rows s < r (`decayed` [SEQ, BK]), in one reduction over the key
    rows, k and q [BK] as read: -> (‖k‖, ‖q‖ as `key_l2norm`'s KDA form divides by them (1 for a draft, or
    without L2NORM), the k̂ column [SEQ] of Σ k̂_r·k_s·e^{..} for s < r, the q̂ column for s <= r (q̂ unscaled)).
    The reduction's rows are the decayed keys, k at row r and q at row r + 1 (a row not yet used: SEQ > P + T),
    against (k, q): k·k, k·q and q·q come out of it beside the pairs."""
    probe = tl.where(seq[:, None] == r, k[None, :], decayed)
    if L2NORM:
        probe = tl.where(seq[:, None] == r + 1, q[None, :], probe)
    on_k, on_q = tl.split(tl.sum(probe[:, None, :] * tl.join(k, q).permute(1, 0)[None, :, :], 2))  # [SEQ] each
    k_norm = 1.0
    q_norm = 1.0
    if L2NORM:
        k_norm = tl.where(new, tl.sqrt(tl.sum(tl.where(seq == r, on_k, 0.0), 0) + 1e-6), 1.0)
        q_norm = tl.where(new, tl.sqrt(tl.sum(tl.where(seq == r + 1, on_q, 0.0), 0) + 1e-6), 1.0)
    kk = tl.where(seq < r, on_k, 0.0) / k_norm
    qk = tl.where(seq < r, on_q, tl.where(seq == r, on_q / k_norm, 0.0)) / q_norm
    return k_norm, q_norm, kk, qk


@triton.jit
def _padded(x):
    """x [SEQ, N] as the first SEQ rows of a [2·SEQ, N] tile, zeros below (a product's least inner size 16)."""
    return tl.reshape(tl.join(x, tl.zeros_like(x)).permute(2, 0, 1), [2 * x.shape[0], x.shape[1]])


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
    T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, P: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, NVB: tl.constexpr, L2NORM: tl.constexpr, RAW_GATE: tl.constexpr,
    SEQ: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    """As `triton_verify._kda_verify_kernel` (same arguments); SEQ (8 or 16) > P + T rows a sequence. Tiles of
    2·SEQ rows: row r a sequence row's key side, row SEQ + r its query side."""
    pdl_entry(PDL)
    row, hd, vb = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    s, valid, n = pending_row(slot_ptr, n_ptr, row, s_n, P)
    kk, k_ok, vv, v_ok, tile, ssm_tile, h0 = state_tile(ssm_ptr, s, hd, vb, valid, s_ss, s_sh, s_sk, s_sv, K, V,
                                                        BK, BV)
    neg_A = 0.0
    dt_bias = tl.zeros([BK], dtype=tl.float32)
    if RAW_GATE:
        neg_A = -tl.exp(tl.load(alog_ptr + hd).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hd * K + kk, mask=k_ok, other=0.0).to(tl.float32)
    LP: tl.constexpr = 2 * SEQ
    rows = tl.arange(0, LP)
    cols = tl.arange(0, LP)
    e_gam = tl.zeros([BK], dtype=tl.float32) + 1.0  # e^{Γ_r}
    e_gam_n = e_gam
    rows_p = tl.zeros([LP, BK], dtype=tl.float32)  # r: e^{Γ_r}⊙k_r; SEQ + r: e^{Γ_r}⊙q_r (q scaled)
    seq = tl.arange(0, SEQ)
    decayed = tl.zeros([SEQ, BK], dtype=tl.float32)  # s < r (then s <= r): k_s⊙e^{Γ_r−Γ_s}
    decayed_n = decayed
    between_t = tl.zeros([SEQ, LP], dtype=tl.float32)  # (s, r): β_r·Σ k_r·k_s·e^{..}, s < r; (s, SEQ + r): q_r's
    rhs = tl.zeros([LP, BV], dtype=tl.float32)  # r: β_r·v_r
    betas = tl.zeros([LP], dtype=tl.float32)
    for r in tl.static_range(SEQ):
        k_r, g_r, q_r, v_r, b_r = _sequence_row(
            r, n, row, s, hd, kk, k_ok, vv, v_ok, neg_A, dt_bias, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
            pk_ptr, pg_ptr, pv_ptr, pb_ptr, s_qb, s_qt, s_qh, s_kib, s_kit, s_kih, s_vib, s_vit, s_vih, s_gib, s_git,
            s_gih, s_bib, s_bit, s_bih, s_ks, s_kp, s_kh, s_kk, s_gs, s_gp, s_gh, s_gk, s_vs, s_vp, s_vh, s_vv, s_bs,
            s_bp, s_bh, T, RAW_GATE)
        decay = tl.exp(g_r)
        e_gam = e_gam * decay
        decayed = decayed * decay[None, :]
        k_norm, q_norm, kk_r, qk_r = _row_products(decayed, k_r, q_r, seq, r, (r >= n) & (r < n + T), L2NORM)
        k_r = k_r / k_norm
        q_r = q_r / q_norm * scale
        qk_r = qk_r * scale
        decayed = tl.where(seq[:, None] == r, k_r[None, :], decayed)
        between_t = tl.where(cols[None, :] == r, (b_r * kk_r)[:, None], between_t)
        between_t = tl.where(cols[None, :] == SEQ + r, qk_r[:, None], between_t)
        rows_p = tl.where(rows[:, None] == r, (e_gam * k_r)[None, :], rows_p)
        rows_p = tl.where(rows[:, None] == SEQ + r, (e_gam * q_r)[None, :], rows_p)
        rhs = tl.where(rows[:, None] == r, (b_r * v_r)[None, :], rhs)
        betas = tl.where(rows == r, b_r, betas)
        e_gam_n = tl.where(r == n, e_gam, e_gam_n)
        decayed_n = tl.where(r == n, decayed, decayed_n)

    # (r, v): h₀ᵀ(e^{Γ_r}⊙k_r) on rows r, h₀ᵀ(e^{Γ_r}⊙q_r) on rows SEQ + r
    w = tl.dot(rows_p, h0, input_precision="tf32x3")
    rhs = tl.where(rows[:, None] < SEQ, rhs - betas[:, None] * w, 0.0)
    between = tl.trans(_padded(between_t))  # (i, s)
    keys_side = (rows[:, None] < SEQ) & (cols[None, :] < SEQ)
    nil = tl.where(keys_side, between, 0.0)  # N: strictly lower, the u rows' coefficients
    eye = tl.where(rows[:, None] == cols[None, :], 1.0, 0.0)
    power = nil
    inverse = eye - nil
    for i in tl.static_range(1, 6):  # (I − N)(I + N²)(I + N⁴)… = Σ_{j<SEQ} (−N)^j, as N^SEQ = 0
        if (1 << i) < SEQ:
            power = tl.dot(power, power, input_precision="ieee")
            inverse = tl.dot(inverse, eye + power, input_precision="ieee")
    u = tl.dot(inverse, rhs, input_precision="tf32x3")  # rows r < n + T; zeros past them
    queries = tl.where((rows[:, None] >= SEQ) & (cols[None, :] < SEQ), between, 0.0)
    o = w + tl.dot(queries, u, input_precision=PRECISION)  # rows SEQ + r
    t = rows - SEQ - n
    o_rows = o_ptr + ((row * T + t[:, None]) * H + hd) * V + vv[None, :]
    tl.store(o_rows, tl.where(valid, o, 0.0).to(o_ptr.dtype.element_ty),
             mask=(t >= 0)[:, None] & (t < T)[:, None] & v_ok[None, :])
    h_n = tl.dot(tl.trans(_padded(decayed_n)), u, acc=e_gam_n[:, None] * h0, input_precision="tf32x3")
    tl.store(ssm_tile, h_n, mask=tile & valid)
