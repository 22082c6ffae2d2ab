"""Mamba2 replay verify as one Triton kernel: slots, checkpoint and history read and written in place.

Same contract as `replay.mamba2_verify` (see `naive.mamba2_verify_ref`): per row with p = pnat[slot] and
b = buf_idx[slot], fold = p + T > HIST; the p history tokens of buffer b are folded into the checkpoint,

    h_eff = exp(c_last) h + sum_{j < p} exp(c_last - c_j) dt_j x_j B_j^T,   c = replay_dA_cumsum, c_last = c_{p-1}

which only folding rows write back; the T new tokens then run recurrently from h_eff,
h <- exp(dt_t A) h + dt_t x_t B_t^T, y_t = C_t h + D x_t, and are appended at [p, p + T) of buffer b
(cumsum continuing from c_last) or, after a fold, at [0, T) of buffer 1 - b (cumsum from 0). pnat and
buf_idx are read only. A padding row (slot < 0) reads no slot, runs its tokens from a zero state with
no history (as the torch path and the reference do) and writes nothing but its outputs.

Work split. One program takes one (row, head, P-block) and reads the [BLOCK_P, N] fp32 tile of
ssm[slot, head, block]; it stores the folded tile once and only when the row folds, so a row that appends
leaves its checkpoint bit for bit. Token by token, the tile is folded in registers and the tokens update it.
In closed form (the default for T > 1) the tile gives C·hᵀ and is then dropped: the history's share reaches
the new tokens as products with their C rows, and a folding row reads its tile again to fold it (at batch 64 /
256, T = 4, on an H100: 85.2 / 303.8 us against 110.2 / 410.0 with the tile folded and held, no row folding;
benchmarks/tune_mamba2_verify.py). The fold reads only the p valid history tokens, BLOCK_H at a time (a trip
count read on the device, no host sync), each chunk one fp32 product [BLOCK_P, BLOCK_H] x [BLOCK_H, N]
(tf32 for the products with C); every history load is masked, never multiplied by zero, so stale
NaNs at or past p cannot leak. dt is processed (softplus, clamp) in the kernel. Writers: each program
stores its x block; the P-block 0 program of a head stores that head's dt and cumsum; the P-block 0
program of a group's first head alone stores the group's B (one writer: the other heads of the group
hold the same values, and skipping their stores costs nothing). Programs of a row read buffer b at
[0, p) and write [p, p + T) of b or [0, T) of 1 - b, never what another reads, so they need no order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridcache.ops.mamba2.common import NO_LIMIT, DtLimit, check_dims, check_steps
from hybridcache.ops.pdl_triton import pdl_entry, pdl_launch
from hybridcache.ops.token_rows_triton import token_row, token_value
from hybridcache.ops.triton_support import num_sms

MAX_TILE = 4096  # fp32 state elements a program holds token by token: 32 registers a thread at 4 warps
CLOSED_TILE = 8192  # in closed form, which holds no per-token copies of the tile (fastest measured, H100)
BLOCK_H = 16  # history tokens per fold product (tl.dot needs every dim >= 16)
# the closed form's history-loop pipeline (H100, batch 64: 1 stage 367 us, 2 106, Triton's 3 111); the
# token-by-token form keeps Triton's (not timed otherwise)
NUM_STAGES = 2
# the closed form as a program a (row, group, run of heads), where no block_p is asked for (`triton_verify_heads`):
# on an H100, ops_mamba2.py's replay verify + accept at batch 16 / 64 / 256, 0.031 / 0.088 / 0.343 ms against
# this kernel's 0.033 / 0.099 / 0.380 (session 56; that module has the figures). It runs from HEADS_FROM rows:
# below, it lost (0.009 / 0.010 / 0.011 / 0.022 ms at batch 1 / 2 / 4 / 8 against 0.008 / 0.009 / 0.010 / 0.021,
# k = 3, and likewise at k = 1); at 32 it won, 0.050 against 0.057
HEADS = True
HEADS_FROM = 16
MAX_HIST = 32  # and the history fits its one product


@triton.jit
def softplus(v):
    """log(1 + exp(v)) as torch's softplus (v past 20 returned as is), with an accurate log1p."""
    u = tl.exp(-tl.abs(v))
    w = 1.0 + u
    log1p = tl.where(w == 1.0, u, tl.log(w) * (u / tl.where(w == 1.0, 1.0, w - 1.0)))
    return tl.where(v > 20.0, v, tl.maximum(v, 0.0) + log1p)


@triton.jit
def _tokens_closed_form(ch, cf, xs_new, bs_new, dtp, a, tt, PRECISION: tl.constexpr):
    """The new tokens' y at once from ch = C·hᵀ [TP, BLOCK_P] (C_t·h[p] for the state h they start from),
    without updating h: with c_t = Σ_{s<=t} dt_s·A,
        y_t = e^{c_t}·h·C_t + Σ_{s<=t} e^{c_t − c_s}·(C_t·B_s)·dt_s·x_s     (D·x_t not included)
    the recurrence unrolled; rows tt [TP] (TP >= 16, a dot's least size) of xs_new [TP, BLOCK_P], bs_new [TP, N],
    cf [TP, N] fp32 (zero past T) and the processed dtp [TP]. Products on the tensor cores in PRECISION.
    -> y [TP, BLOCK_P] fp32 and c [TP] (from 0)."""
    c = tl.cumsum(dtp * a, 0)
    cb = tl.dot(cf, tl.trans(bs_new.to(tl.float32)), input_precision=PRECISION)  # (t, s): C_t·B_s
    decay = tl.where(tt[None, :] <= tt[:, None], tl.exp(c[:, None] - c[None, :]), 0.0)
    y = tl.exp(c)[:, None] * ch + tl.dot(decay * cb * dtp[None, :], xs_new.to(tl.float32), input_precision=PRECISION)
    return y, c


@triton.jit
def _history_chunk(rx_row, rb_row, rd_row, rc_row, rx_t, rx_p, rb_t, rb_n, rd_t, rc_t, j0, count, c_last, pp, p_ok,
                   nn, n_ok, BLOCK_H: tl.constexpr):
    """History tokens [j0, j0 + BLOCK_H) of a buffer, masked at `count`: x weighted by w_j = e^{c_last − c_j}·dt_j
    [BLOCK_P, BLOCK_H] and B [BLOCK_H, N], fp32 (zeros past count; loads masked, never multiplied by zero)."""
    j = j0 + tl.arange(0, BLOCK_H)
    j_ok = j < count
    c = tl.load(rc_row + j * rc_t, mask=j_ok, other=0.0).to(tl.float32)
    d = tl.load(rd_row + j * rd_t, mask=j_ok, other=0.0).to(tl.float32)
    w = tl.where(j_ok, tl.exp(c_last - c) * d, 0.0)
    xs = tl.load(rx_row + j[None, :] * rx_t + pp[:, None] * rx_p, mask=p_ok[:, None] & j_ok[None, :], other=0.0)
    bs = tl.load(rb_row + j[:, None] * rb_t + nn[None, :] * rb_n, mask=j_ok[:, None] & n_ok[None, :], other=0.0)
    return xs.to(tl.float32) * w[None, :], bs.to(tl.float32)


@triton.jit
def _history_sum(rx_row, rb_row, rd_row, rc_row, rx_t, rx_p, rb_t, rb_n, rd_t, rc_t, count, c_last, pp, p_ok, nn,
                 n_ok, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):
    """Σ_{j < count} w_j·x_j·B_jᵀ [BLOCK_P, N], the history's share of h_eff, in fp32 (products in IEEE fp32: a
    fold stores it), BLOCK_H tokens a product."""
    acc = tl.zeros([BLOCK_P, BLOCK_N], tl.float32)
    for j0 in range(0, count, BLOCK_H):
        xw, bs = _history_chunk(rx_row, rb_row, rd_row, rc_row, rx_t, rx_p, rb_t, rb_n, rd_t, rc_t, j0, count, c_last,
                                pp, p_ok, nn, n_ok, BLOCK_H)
        acc += tl.dot(xw, bs, input_precision="ieee")
    return acc


@triton.jit
def _verify_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, bias_ptr,
    ssm_ptr, rx_ptr, rb_ptr, rdt_ptr, rcum_ptr, pnat_ptr, buf_ptr, slot_ptr, y_ptr,
    dt_lo, dt_hi, hist,
    sx_b, sx_t, sx_h, sx_p,
    sd_b, sd_t, sd_h,
    sB_b, sB_t, sB_g, sB_n,
    sC_b, sC_t, sC_g, sC_n,
    ss_s, ss_h, ss_p, ss_n,
    rx_s, rx_b, rx_t, rx_h, rx_p,
    rb_s, rb_b, rb_t, rb_g, rb_n,
    rd_s, rd_b, rd_h, rd_t,
    rc_s, rc_b, rc_h, rc_t,
    s_pnat, s_buf, s_slot,
    sy_b, sy_t, sy_h,
    STEPS: tl.constexpr, HEAD_DIM: tl.constexpr, DSTATE: tl.constexpr, REPS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, TP: tl.constexpr, CLOSED_FORM: tl.constexpr,
    PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    row, head, pblk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    group = head // REPS
    slot = tl.load(slot_ptr + row * s_slot).to(tl.int64)
    valid = slot >= 0
    sc = tl.maximum(slot, 0)
    p = tl.load(pnat_ptr + sc * s_pnat, mask=valid, other=0).to(tl.int32)
    buf = tl.load(buf_ptr + sc * s_buf, mask=valid, other=0).to(tl.int64)
    fold = valid & (p + STEPS > hist)
    count = tl.minimum(p, hist)  # history tokens read (p <= HIST by contract; the min keeps loads in bounds)

    pp = pblk * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = pp < HEAD_DIM
    nn = tl.arange(0, BLOCK_N)
    n_ok = nn < DSTATE
    tile_ok = p_ok[:, None] & n_ok[None, :]
    # every new token's inputs first, in one round trip (`token_rows_triton`)
    tt = tl.arange(0, TP)
    t_ok = tt < STEPS
    xs_new = tl.load(x_ptr + row * sx_b + tt[:, None] * sx_t + head * sx_h + pp[None, :] * sx_p,
                     mask=t_ok[:, None] & p_ok[None, :], other=0.0)
    bs_new = tl.load(B_ptr + row * sB_b + tt[:, None] * sB_t + group * sB_g + nn[None, :] * sB_n,
                     mask=t_ok[:, None] & n_ok[None, :], other=0.0)
    cs_new = tl.load(C_ptr + row * sC_b + tt[:, None] * sC_t + group * sC_g + nn[None, :] * sC_n,
                     mask=t_ok[:, None] & n_ok[None, :], other=0.0)
    raws = tl.load(dt_ptr + row * sd_b + tt * sd_t + head * sd_h, mask=t_ok, other=0.0)
    ssm_tile = ssm_ptr + sc * ss_s + head * ss_h + pp[:, None] * ss_p + nn[None, :] * ss_n
    h = tl.load(ssm_tile, mask=tile_ok & valid, other=0.0)

    # Fold the history [0, count) of buffer `buf`: h_eff = exp(c_last) h + X W B.
    rx_row = rx_ptr + sc * rx_s + buf * rx_b + head * rx_h
    rb_row = rb_ptr + sc * rb_s + buf * rb_b + group * rb_g
    rd_row = rdt_ptr + sc * rd_s + buf * rd_b + head * rd_h
    rc_row = rcum_ptr + sc * rc_s + buf * rc_b + head * rc_h
    c_last = tl.load(rc_row + (count - 1) * rc_t, mask=count > 0, other=0.0).to(tl.float32)
    # In closed form the new tokens take the history's share as products with their C rows,
    # C·h_effᵀ = e^{c_last}·C·hᵀ + (C·B_histᵀ ⊙ w)·X_histᵀ, and only a folding row forms h_eff (in fp32, in a
    # second pass that reads its tile again: the tile is not held while the products run). Token by token,
    # h_eff is formed first. The whole tile at once was the fastest (H200, batch 64 / 256, us): 80.7 / 298.5;
    # 64 state columns at a time 96.1 / 360.6, 32 at a time 110.4 / 406.3; capped at 168 registers a thread
    # 84.7 / 308.8, 83.3 / 309.6, 88.0 / 322.0; likewise where every row folds (session 42, tune_mamba2_verify).
    # Triton's 4 warps stay (H100, block_p 64, batch 64 / 256): 84.4 / 303.9 against 152.2 / 581.4 at 8 warps;
    # 2 warps over block_p 32 took 91.5 / 341.8. C·hᵀ as one fp32 row sum over the tile a token instead of the
    # tf32 product (no shared-memory round trip of the tile; session 46, history caa8391) took 188.1 / 725.0
    # against 83.7 / 305.2 (H100, block_p 64, batch 64 / 256). Nor did (session 54, history 416751d; H100, batch
    # 64 / 256, us, against 83.6 / 303.8): C·hᵀ in a streaming launch of its own (the decode's 2,048-entry tiles;
    # this kernel then held no tile) 111.9 / 437.9; every product as fp32 broadcasts and sums, no tensor cores,
    # 167.4 / 637.0 at its best tiling (64 channels x 4 warps), 282.8 / 1,111.3 at 16 channels (123 registers).
    e_last = tl.exp(c_last)
    cf = cs_new.to(tl.float32)
    if CLOSED_FORM:
        ch = e_last * tl.dot(cf, tl.trans(h), input_precision=PRECISION)  # (t, p): e^{c_last}·C_t·h[p]
        for j0 in range(0, count, BLOCK_H):
            xw, bs = _history_chunk(rx_row, rb_row, rd_row, rc_row, rx_t, rx_p, rb_t, rb_n, rd_t, rc_t, j0, count,
                                    c_last, pp, p_ok, nn, n_ok, BLOCK_H)
            cb_hist = tl.dot(cf, tl.trans(bs), input_precision=PRECISION)  # (t, j): C_t·B_j
            ch = tl.dot(cb_hist, tl.trans(xw), acc=ch, input_precision=PRECISION)
        if fold:  # the sum first: the tile is read again only once it is done (64 registers a thread at 64 x 128)
            acc = _history_sum(rx_row, rb_row, rd_row, rc_row, rx_t, rx_p, rb_t, rb_n, rd_t, rc_t, count, c_last, pp,
                               p_ok, nn, n_ok, BLOCK_P, BLOCK_N, BLOCK_H)
            tl.store(ssm_tile, tl.load(ssm_tile, mask=tile_ok, other=0.0) * e_last + acc, mask=tile_ok)
    else:
        h = h * e_last + _history_sum(rx_row, rb_row, rd_row, rc_row, rx_t, rx_p, rb_t, rb_n, rd_t, rc_t, count,
                                      c_last, pp, p_ok, nn, n_ok, BLOCK_P, BLOCK_N, BLOCK_H)
        tl.store(ssm_tile, h, mask=tile_ok & fold)

    # The new tokens, one after another; appended at [start, start + T) of buffer `target`.
    target = tl.where(fold, 1 - buf, buf)
    start = tl.where(fold, 0, p).to(tl.int64)
    cum = tl.where(fold, 0.0, c_last)
    a = tl.load(A_ptr + head).to(tl.float32)
    head_writer = valid & (pblk == 0)
    group_writer = head_writer & (head % REPS == 0)
    wx_row = rx_ptr + sc * rx_s + target * rx_b + head * rx_h
    wb_row = rb_ptr + sc * rb_s + target * rb_b + group * rb_g
    wd_row = rdt_ptr + sc * rd_s + target * rd_b + head * rd_h
    wc_row = rcum_ptr + sc * rc_s + target * rc_b + head * rc_h
    if CLOSED_FORM:  # every token at once (`_tokens_closed_form`), written as rows
        raw = raws.to(tl.float32)
        if HAS_BIAS:
            raw += tl.load(bias_ptr + head).to(tl.float32)
        dtp = tl.minimum(tl.maximum(softplus(raw), dt_lo), dt_hi)  # rows past T add nothing: their B is 0
        y, c = _tokens_closed_form(ch, cf, xs_new, bs_new, dtp, a, tt, PRECISION)
        if HAS_D:
            y += tl.load(D_ptr + head).to(tl.float32) * xs_new.to(tl.float32)
        tp = t_ok[:, None] & p_ok[None, :]
        tl.store(y_ptr + row * sy_b + tt[:, None] * sy_t + head * sy_h + pp[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=tp)
        pos = start + tt
        tl.store(wx_row + pos[:, None] * rx_t + pp[None, :] * rx_p, xs_new.to(rx_ptr.dtype.element_ty),
                 mask=tp & valid)
        tl.store(wb_row + pos[:, None] * rb_t + nn[None, :] * rb_n, bs_new.to(rb_ptr.dtype.element_ty),
                 mask=t_ok[:, None] & n_ok[None, :] & group_writer)
        tl.store(wd_row + pos * rd_t, dtp.to(rdt_ptr.dtype.element_ty), mask=t_ok & head_writer)
        tl.store(wc_row + pos * rc_t, (cum + c).to(rcum_ptr.dtype.element_ty), mask=t_ok & head_writer)
    else:  # token by token
        for t in tl.static_range(STEPS):
            xf = token_row(xs_new, tt, t).to(tl.float32)
            bf = token_row(bs_new, tt, t).to(tl.float32)
            cf = token_row(cs_new, tt, t).to(tl.float32)
            raw = token_value(raws, tt, t).to(tl.float32)
            if HAS_BIAS:
                raw += tl.load(bias_ptr + head).to(tl.float32)
            dtp = tl.minimum(tl.maximum(softplus(raw), dt_lo), dt_hi)
            dA = dtp * a
            cum += dA
            h = h * tl.exp(dA) + (dtp * xf)[:, None] * bf[None, :]
            y = tl.sum(h * cf[None, :], 1)
            if HAS_D:
                y += tl.load(D_ptr + head).to(tl.float32) * xf
            tl.store(y_ptr + row * sy_b + t * sy_t + head * sy_h + pp, y.to(y_ptr.dtype.element_ty), mask=p_ok)
            pos = start + t
            tl.store(wx_row + pos * rx_t + pp * rx_p, xf.to(rx_ptr.dtype.element_ty), mask=p_ok & valid)
            tl.store(wb_row + pos * rb_t + nn * rb_n, bf.to(rb_ptr.dtype.element_ty), mask=n_ok & group_writer)
            tl.store(wd_row + pos * rd_t, dtp.to(rdt_ptr.dtype.element_ty), mask=head_writer)
            tl.store(wc_row + pos * rc_t, cum.to(rcum_ptr.dtype.element_ty), mask=head_writer)


def default_block_p(rows: int, head_dim: int, block_n: int, closed_form: bool, sms: int) -> int:
    """Head channels a program for `rows` (row, head) pairs: the largest tile the form holds, halved while the
    doubled grid still fits in one wave (at most one program an SM), never under 16 (a dot's least size)."""
    tile = CLOSED_TILE if closed_form else MAX_TILE
    block_p = max(16, min(triton.next_power_of_2(head_dim), tile // block_n))
    while block_p > 16 and 2 * rows * triton.cdiv(head_dim, block_p) <= sms:
        block_p //= 2
    return block_p


def mamba2_verify_triton(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    replay_x: Tensor,
    replay_B: Tensor,
    replay_dt: Tensor,
    replay_dA_cumsum: Tensor,
    pnat: Tensor,
    buf_idx: Tensor,
    slots: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
    block_p: int | None = None,
    closed_form: bool | None = None,
    num_warps: int | None = None,
) -> Tensor:
    """Replay verify in one launch (two in the heads form, where HEADS sends the closed form with no block_p asked
    for, from HEADS_FROM rows: `triton_verify_heads`); same arguments, writes and result as `replay.mamba2_verify`.

    x: [B, T, H, P]; dt: [B, T, H] raw; B, C: [B, T, G, N]; ssm: [S, H, P, N] fp32; replay_x
    [S, 2, HIST, H, P]; replay_B [S, 2, HIST, G, N]; replay_dt, replay_dA_cumsum [S, 2, H, HIST];
    pnat, buf_idx [S] (read only); slots [B]. Any strides (pool views are read and written in place).
    Returns y: [B, T, H, P] in x's dtype. `block_p` (head channels per program, a power of two >= 16)
    defaults to `default_block_p` and, like `num_warps` (Triton's default 4), does not change the result beyond
    rounding. `closed_form`: the new tokens as products (`_tokens_closed_form`: tf32x3 for fp32 inputs, tf32 for
    16-bit), not token by token; the results agree within rounding. The default for T > 1 (at T = 4 and batch 64,
    113 against 180 us on an H100).
    """
    batch, steps = x.shape[:2]
    hist = replay_x.shape[2]
    check_steps(steps, hist)
    heads, head_dim, groups, dstate, reps = check_dims(x, B, ssm)
    if heads % groups:
        raise ValueError(f"num_heads {heads} is not a multiple of ngroups {groups}")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if batch == 0 or steps == 0:
        return y
    block_n = max(16, triton.next_power_of_2(dstate))
    if closed_form is None:
        closed_form = steps > 1
    if closed_form and block_p is None and HEADS and batch >= HEADS_FROM and hist <= MAX_HIST:
        from hybridcache.ops.mamba2.triton_verify_heads import mamba2_verify_heads_triton

        return mamba2_verify_heads_triton(x, dt, A, B, C, ssm, replay_x, replay_B, replay_dt, replay_dA_cumsum, pnat,
                                          buf_idx, slots, D, dt_bias, dt_limit, num_warps=num_warps)
    if block_p is None:
        block_p = default_block_p(batch * heads, head_dim, block_n, closed_form, num_sms(x.device))
    A = A.contiguous()
    D_arg = A if D is None else D.contiguous()
    bias_arg = A if dt_bias is None else dt_bias.contiguous()
    grid = (batch, heads, triton.cdiv(head_dim, block_p))
    _verify_kernel[grid](
        x, dt, A, B, C, D_arg, bias_arg,
        ssm, replay_x, replay_B, replay_dt, replay_dA_cumsum, pnat, buf_idx, slots, y,
        float(dt_limit[0]), float(dt_limit[1]), hist,
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *ssm.stride(),
        *replay_x.stride(), *replay_B.stride(), *replay_dt.stride(), *replay_dA_cumsum.stride(),
        pnat.stride(0), buf_idx.stride(0), slots.stride(0),
        *y.stride()[:3],
        STEPS=steps, HEAD_DIM=head_dim, DSTATE=dstate, REPS=reps,
        BLOCK_P=block_p, BLOCK_N=block_n, BLOCK_H=BLOCK_H,
        HAS_D=D is not None, HAS_BIAS=dt_bias is not None,
        TP=max(16 if closed_form else 1, triton.next_power_of_2(steps)), CLOSED_FORM=closed_form,
        PRECISION="tf32x3" if x.dtype == torch.float32 else "tf32",
        **({"num_stages": NUM_STAGES} if closed_form else {}), **pdl_launch(x),
        **({"num_warps": num_warps} if num_warps else {}),
    )
    return y
