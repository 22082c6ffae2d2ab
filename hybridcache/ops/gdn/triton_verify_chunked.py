"""Gated DeltaNet's replay verify of T > 1 new tokens in closed form, one Triton launch: the work split, roles
and writes of `triton_verify.py` (`ops/delta_rule_verify_triton.py` has the split), with every step a product.

A program (row, value head, value block) reads the new tokens' rows whole, then its state KEY_BLOCK key rows at
a time: each block of the effective state (checkpoint·e^{G_last} + K_histᵀ·(w ⊙ U_hist), one product over the
history [0, p) of buffer b) adds its share to P·h, and nothing is written until every block is read; a folding row
then stores the blocks in a second pass. P [TP, K] (TP >= 2T) holds the new tokens' keys in rows [0, T) and their
queries in rows [T, 2T), so one product a block gives both K·h and Q·h, and one product P·Kᵀ both K·Kᵀ and
Q·Kᵀ.
The new tokens come out of `_gdn_tokens_chunked` without ever updating the tile.

The keys and queries as two operands, two products a block (session 53, history 232e49d) spilled at sm_90 (255
registers and 268 bytes a thread uncapped, 796 at MAX_REGISTERS, against 251 and none, 348 packed). H100,
ops_gdn.py's replay verify + accept, ms at batch 16 / 64 / 256, two runs each in one call: two operands 0.033 /
0.102 / 0.367 and 0.032 / 0.103 / 0.365, packed 0.034 / 0.093 / 0.334 and 0.034 / 0.093 / 0.335 (72.2% of the
copy bandwidth at batch 64, against 65.5%); tune_delta_rule.py with the raw gate, us at batch 64 / 256, 87.4 /
303.8 packed against 95.0 / 334.3.

Timed on an H100 (benchmarks/tune_delta_rule.py, us at batch 1 / 16 / 64 / 256, T = 4,
HIST 16, history half full): an earlier form that read the state whole and stored it inline, at 32 value
columns x 2 warps, 7.7 / 36.2 / 126.7 / 470.1, against 9.7 / 34.6 / 154.9 / 556.0 token by token at its best
tiling; in one later run, 32 key rows at a time at 64 columns x 2 warps (x 4 where the grid has fewer programs
than SMs), 8.4 / 32.7 / 117.0 / 438.0, against the whole read's 7.6 / 35.6 / 124.3 / 467.4 (6.7 at batch 1
with 4 warps); then at one pipeline stage (NUM_STAGES) 27.0 / 103.0 / 381.6 from batch 16. The same loads and
history product with the tokens taken one by one were no faster (150.3 us at batch 64); nor was the history's
share taken as products with the new rows, (K·K_histᵀ)·(w ⊙ U_hist) with the effective state formed only to fold
(115.2 against 103.6 us at batch 64, 417.2 against 381.3 at 256, H100; 255 registers against 233), which
Mamba2's verify gains from; nor this kernel's form at T = 1 (92.5 / 362.4 us at batch 64 / 256 against 92.5 /
330.8): there the token-by-token kernel stays. On an H200 (session 42, us at batch 16 / 64 / 256) a cap of 168
registers a thread (Triton's maxnreg: 6 programs an SM where 233 registers allow 4, 64 bytes spilled) took
29.9 / 92.0 / 334.4 against 26.0 / 101.2 / 378.3: it pays once the grid is many waves deep (`register_cap`).
Other caps on an H100 (us at batch 32 / 64 / 256): none 54.9 / 104.5 / 382.4, 128 64.5 / 121.8 / 438.8, 144
61.4 / 111.3 / 386.3, 168 54.5 / 97.0 / 336.4, 192 (5 programs an SM, no spills) 55.5 / 106.8 / 386.5.
Nor were the state's products as fp32 reductions (session 45, history commit a6a2746): the tile read BKC key rows
at a time in its load layout, each token's k·h and q·h reduced over the key rows (no tensor-core layout for the
tile to pass through shared memory in, where Nsight Compute finds about half of this form's shared-memory store
wavefronts in bank conflicts), and the history's share through the new rows' products with its keys. H100, us
at batch 16 / 64 / 256 at its best tiling (64 value columns x 1 warp, no cap; 207 to 255 registers): 32.7 /
131.4 / 501.1 against this form's 26.9 / 97.0 / 337.0 (64 x 2) in the same call; ops_gdn.py's replay at batch
64 / 256, 0.194 / 0.693 ms against 0.108 / 0.390.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..delta_rule_triton import gdn_raw_gate
from ..delta_rule_verify_triton import replay_row
from ..pdl_triton import pdl_entry
from ..token_rows_triton import token_row, token_value
from ..triton_dot import dot

BLOCK_V = 64
KEY_BLOCK = 32
NUM_WARPS = 2  # doubled where the grid has fewer programs than the device has SMs
MAX_REGISTERS = 168  # a thread, from CAP_FROM programs an SM (at batch 64 and up for 32 value heads)
CAP_FROM = 16
# 16-bit inputs: the state's products with the new rows' keys and queries on bf16 operands with fp32 sums (the
# state blocks rounded to bf16 for them only; a fold stores the fp32 blocks), half the shared-memory bytes of tf32's.
# Faster, spills and all (session 46, H100, us at batch 16 / 64 / 256 at the default tiling, against tf32 in the same
# call): with the raw gate, as the engine launches it, 25.8 / 94.7 / 336.1 against 27.6 / 100.1 / 356.4; g and beta
# given, 25.1 / 90.4 / 319.3 against 27.4 / 95.5 / 340.1; ops_gdn.py's replay at batch 16 / 64 / 256, 0.033 / 0.102
# / 0.366 ms against 0.034 / 0.109 / 0.388. It spills at sm_90 (raw gate, benchmarks/kernel_registers.py: 268 bytes a
# thread uncapped, 796 at MAX_REGISTERS, where tf32 spills none / 64); the forms that do not were slower: 16 key
# rows a block (raw gate 100.0 / 354.0 us at batch 64 / 256) and no register cap (97.7 / 355.2); 4 warps slower still.
# (Mamba2's closed form so, its tile's product with the C rows on bf16 operands, missed its bf16 tolerance in the
# interpreter: outputs off by up to 0.0625 against 1e-2; not kept.)
BF16_STATE = True
NUM_STAGES = 1  # the key-block loop not software-pipelined: 103 against 120 us at batch 64 with Triton's 3 (H100)


@triton.jit
def _effective_block(ssm_ptr, k_row, s, hv, kc, kc_ok, vv, v_ok, jj, j_ok, uw, e_last, valid,
                     s_ss, s_sh, s_sk, s_sv, s_kt, s_kk):
    """Key block kc of the effective state: checkpoint·e^{G_last} + K_hist[:, kc]ᵀ·(w ⊙ U_hist), [BKC, BV] fp32
    (one tf32x3 product: fp32's accuracy, as a fold stores it), with its pointers and mask."""
    tile = kc_ok[:, None] & v_ok[None, :]
    ptrs = ssm_ptr + s * s_ss + hv * s_sh + kc[:, None] * s_sk + vv[None, :] * s_sv
    h = tl.load(ptrs, mask=tile & valid, other=0.0).to(tl.float32)
    k_hist = tl.load(k_row + jj[:, None] * s_kt + kc[None, :] * s_kk, mask=j_ok[:, None] & kc_ok[None, :], other=0.0)
    h = h * e_last + tl.dot(tl.trans(k_hist.to(tl.float32)), uw, input_precision="tf32x3")
    return h, ptrs, tile


@triton.jit
def _packed_rows(k_in, q_in, rows, is_k, p_ok, tok, kc, kc_ok, s_kt, s_qt, factor):
    """The new tokens' keys (rows < T) then queries (rows T..2T - 1, token row - T) at columns kc, [TP, BKC]
    fp32, times `factor` [TP] (1 / the row norm where L2NORM, times the scale on query rows)."""
    base = tl.where(is_k, k_in + tok * s_kt, q_in + tok * s_qt)
    x = tl.load(base[:, None] + kc[None, :], mask=p_ok[:, None] & kc_ok[None, :], other=0.0).to(tl.float32)
    return x * factor[:, None]


@triton.jit
def _gdn_tokens_chunked(hp, pk, v_all, g_all, b_all, G0, rows, tok, is_q, T: tl.constexpr, PRECISION: tl.constexpr):
    """The T new tokens in closed form from the packed products of P (rows t < T: k_t; rows T + t: q_t) with the
    state h [BK, BV] and with the keys, hp = P·h [TP, BV] and pk = P·Kᵀ [TP, TP]; rows [TP] (TP >= 2T, and 16, a
    dot's least size) of v_all [TP, BV], g_all and b_all [TP] by token, zeros past T; tok [TP] each packed row's
    token, is_q [TP] the query rows. With Γ_t = g_0 + … + g_t:
      u_t = β_t·(v_t − e^{Γ_t}·hᵀk_t − Σ_{s<t} e^{Γ_t−Γ_s}(k_s·k_t)·u_s)   (solved forward over t)
      o_t = e^{Γ_t}·hᵀq_t + Σ_{s≤t} e^{Γ_t−Γ_s}(k_s·q_t)·u_s
    the recurrence h_t = e^{g_t}·h_{t−1} + k_t·u_tᵀ, o_t = h_tᵀq_t unrolled. -> o [TP, BV] on the query rows
    (row T + t: token t), u [TP, BV] and the running G [TP] (from G0) by token."""
    upto = rows[None, :] <= rows[:, None]  # (t, s): s <= t
    gam = tl.sum(tl.where(upto, g_all[None, :], 0.0), 1)  # Γ_t = g_0 + … + g_t
    gam_p = tl.sum(tl.where(rows[None, :] <= tok[:, None], g_all[None, :], 0.0), 1)  # Γ of each packed row's token
    decay = tl.where(upto, tl.exp(gam[:, None] - gam[None, :]), 0.0)
    rhs = b_all[:, None] * (v_all.to(tl.float32) - tl.exp(gam)[:, None] * hp)
    coef = tl.where(rows[None, :] < rows[:, None], b_all[:, None] * decay * pk, 0.0)
    u_all = tl.zeros(rhs.shape, dtype=tl.float32)
    for t in tl.static_range(T):
        u_t = token_row(rhs, rows, t) - tl.sum(token_row(coef, rows, t)[:, None] * u_all, 0)
        u_all = tl.where((rows == t)[:, None], u_t[None, :], u_all)
    q_decay = tl.where(is_q[:, None] & (rows[None, :] <= tok[:, None]), tl.exp(gam_p[:, None] - gam[None, :]), 0.0)
    o_all = tl.exp(gam_p)[:, None] * hp + tl.dot(q_decay * pk, u_all, input_precision=PRECISION)
    return o_all, u_all, G0 + gam


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
    HIST: tl.constexpr, HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BKC: tl.constexpr,
    L2NORM: tl.constexpr, RAW_GATE: tl.constexpr, TOKEN_PRECISION: tl.constexpr, BF16_STATE: tl.constexpr,
    UPCAST: tl.constexpr, PDL: tl.constexpr,
):
    """Inputs q, k, v, g, beta [B, T, heads, ...] by their strides (s_q*, s_ki*, s_v*, s_g*, s_bi*; unit last);
    RAW_GATE: g_ptr and beta_ptr hold the gate's raw a, b, alog_ptr and dtb_ptr A_log, dt_bias [HV]. The state
    is read BKC key rows at a time (BKC = BK: one block); TP >= 2T rows hold the keys, then the queries."""
    pdl_entry(PDL)
    row, hv, vb = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    hk = hv // (HV // H)  # key head of value head hv
    s, valid, p, b, fold = replay_row(slot_ptr, pnat_ptr, buf_ptr, row, s_pnat, s_buf, T, HIST)
    vv = vb * BV + tl.arange(0, BV)
    v_ok = vv < V
    kk = tl.arange(0, BK)
    k_ok = kk < K

    # the new tokens' keys then queries, whole: their norms, and their products with the keys
    rows = tl.arange(0, TP)
    r_ok = rows < T
    is_k, is_q = rows < T, (rows >= T) & (rows < 2 * T)
    p_ok = rows < 2 * T
    tok = tl.where(is_k, rows, rows - T)
    q_in = q_ptr + row * s_qb + hk * s_qh
    k_in = k_ptr + row * s_kib + hk * s_kih
    p_all = _packed_rows(k_in, q_in, rows, is_k, p_ok, tok, kk, k_ok, s_kit, s_qt, tl.full([TP], 1.0, tl.float32))
    factor = tl.where(is_q, scale, 1.0)
    if L2NORM:
        factor = factor * tl.rsqrt(tl.sum(p_all * p_all, 1) + 1e-6)  # `key_l2norm`'s, then the scale
    p_all = p_all * factor[:, None]
    k_all = tl.where(is_k[:, None], p_all, 0.0)
    pk = tl.dot(p_all, tl.trans(k_all), input_precision=TOKEN_PRECISION)  # (r, s): p_r·k_s
    v_all = tl.load(v_ptr + row * s_vb + hv * s_vh + rows[:, None] * s_vt + vv[None, :],
                    mask=r_ok[:, None] & v_ok[None, :], other=0.0)
    g_all = tl.load(g_ptr + row * s_gb + hv * s_gh + rows * s_gt, mask=r_ok, other=0.0).to(tl.float32)
    b_all = tl.load(beta_ptr + row * s_bib + hv * s_bih + rows * s_bit, mask=r_ok, other=0.0).to(tl.float32)
    if RAW_GATE:
        B_DTYPE: tl.constexpr = beta_ptr.dtype.element_ty  # b's dtype, the raw gate rounds beta to it
        neg_A = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
        g_all, b_all = gdn_raw_gate(g_all, b_all, neg_A, tl.load(dtb_ptr + hv).to(tl.float32), B_DTYPE)
        g_all = tl.where(r_ok, g_all, 0.0)

    # the history [0, p) of buffer b: its weights, and its u rows scaled by them
    G_row = hG_ptr + s * s_Gs + b * s_Gb + hv * s_Gh
    u_row = u_ptr + s * s_us + b * s_ub + hv * s_uh
    k_row = hk_ptr + s * s_ks + b * s_kb + hk * s_kh
    jj = tl.arange(0, HP)
    j_ok = jj < p
    G_hist = tl.load(G_row + jj * s_Gt, mask=j_ok, other=0.0).to(tl.float32)
    u_hist = tl.load(u_row + jj[:, None] * s_ut + vv[None, :] * s_uv, mask=j_ok[:, None] & v_ok[None, :], other=0.0)
    G_last = token_value(G_hist, jj, p - 1)  # -0.0 at p = 0
    uw = u_hist.to(tl.float32) * tl.where(j_ok, tl.exp(G_last - G_hist), 0.0)[:, None]
    e_last = tl.exp(G_last)

    # hp = P·h, BKC key rows of the effective state at a time, nothing written; a folding row then stores the blocks
    hp = tl.zeros([TP, BV], dtype=tl.float32)
    for c in range(0, BK // BKC):
        kc = c * BKC + tl.arange(0, BKC)
        kc_ok = kc < K
        h, ptrs, tile = _effective_block(ssm_ptr, k_row, s, hv, kc, kc_ok, vv, v_ok, jj, j_ok, uw, e_last, valid,
                                         s_ss, s_sh, s_sk, s_sv, s_kt, s_kk)
        p_c = _packed_rows(k_in, q_in, rows, is_k, p_ok, tok, kc, kc_ok, s_kit, s_qt, factor)
        if BF16_STATE:  # 16-bit operands (fp32 sums): half the shared-memory bytes, and ldmatrix-able
            hp = dot(p_c.to(tl.bfloat16), h.to(tl.bfloat16), hp, "tf32", UPCAST)
        else:
            hp = tl.dot(p_c, h, acc=hp, input_precision=TOKEN_PRECISION)
    if fold:
        for c in range(0, BK // BKC):
            kc = c * BKC + tl.arange(0, BKC)
            kc_ok = kc < K
            h, ptrs, tile = _effective_block(ssm_ptr, k_row, s, hv, kc, kc_ok, vv, v_ok, jj, j_ok, uw, e_last, valid,
                                             s_ss, s_sh, s_sk, s_sv, s_kt, s_kk)
            tl.store(ptrs, h, mask=tile & valid)

    G = tl.where(fold, 0.0, G_last)
    o_all, u_all, G_all = _gdn_tokens_chunked(hp, pk, v_all, g_all, b_all, G, rows, tok, is_q, T, TOKEN_PRECISION)

    # writes: outputs, and history [p, p + T) of buffer b, or [0, T) of buffer 1 - b after a fold
    nb = tl.where(fold, 1 - b, b)
    pos = tl.where(fold, 0, p) + rows
    writes_shared = valid & (vb == 0)
    writes_key = writes_shared & (hv % (HV // H) == 0)
    rv = r_ok[:, None] & v_ok[None, :]
    o_rows = o_ptr + ((row * T + tok[:, None]) * HV + hv) * V + vv[None, :]
    tl.store(o_rows, tl.where(valid, o_all, 0.0).to(o_ptr.dtype.element_ty), mask=is_q[:, None] & v_ok[None, :])
    hist_b = s * s_us + nb * s_ub + hv * s_uh
    tl.store(u_ptr + hist_b + pos[:, None] * s_ut + vv[None, :] * s_uv, u_all.to(u_ptr.dtype.element_ty),
             mask=rv & valid)
    tl.store(hk_ptr + s * s_ks + nb * s_kb + hk * s_kh + pos[:, None] * s_kt + kk[None, :] * s_kk,
             k_all.to(hk_ptr.dtype.element_ty), mask=r_ok[:, None] & k_ok[None, :] & writes_key)
    tl.store(hG_ptr + s * s_Gs + nb * s_Gb + hv * s_Gh + pos * s_Gt, G_all.to(hG_ptr.dtype.element_ty),
             mask=r_ok & writes_shared)
    tl.store(hb_ptr + s * s_bs + nb * s_bb + hv * s_bh + pos * s_bt, b_all.to(hb_ptr.dtype.element_ty),
             mask=r_ok & writes_shared)
