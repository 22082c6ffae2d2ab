"""Mamba2 replay verify in closed form, a program a (row, group, run of the group's heads): the contract of
`triton_verify.mamba2_verify_triton` (see `naive.mamba2_verify_ref`), for histories of up to
`triton_verify.MAX_HIST` tokens (the whole history one product, [HIST_P, N] fp32 held beside the tile).

The one-head programs of `triton_verify._verify_kernel` each repeat their group's work (its C and B rows, the
history's B, the products C·B) and each wait on the chain of small loads before their state tile (slot, pnat,
the history), at two programs an SM. Here a program reads the row's bookkeeping and its group's rows once,
forms C·Bᵀ against the history and the new tokens once, then takes its heads one after another in a loop
(`tl.range`, NUM_STAGES). Per head, with w_j = e^{c_last − c_j}·dt_j over the history's valid tokens j < count,

    C·h_effᵀ = e^{c_last}·C·hᵀ + (C·B_histᵀ)·(X_hist ⊙ w)ᵀ,    h_eff = e^{c_last}·h + (X_hist ⊙ w)·B_hist

the second formed and stored only where the row folds, by a second launch (`_fold_kernel`, a program a (row,
FOLD_RUN heads), `triton_verify._history_sum`'s IEEE products); the new tokens follow
`triton_verify._tokens_closed_form`. The whole history is one product (HIST_P = HIST rounded up to a power of
two, at least 16: a dot's least size), so the loop over heads holds no inner loop. Every product takes the tile or
the history as its first operand, 64 rows a warpgroup.

Timed on an H100 (benchmarks/tune_mamba2_verify.py, nemotron_h 1B shapes, p = 8 so no row folds, 4 warps, us at
batch 64 / 256, today's kernel 83.3-84.5 / 300.9-306.0 in the same calls; session 55):
- the fold inside this kernel as a loop of its own, a history token at a time: two stages 80.5 / 297.4 at 8 heads
  a program, three 98.9 / 356.2, one **63.8 / 232.5** (72% / 79% of the 3,020 GB/s copy bandwidth). But where
  every row folds (p = 14, two stages, batch 64) that loop took 224.1-269.8 us against 173.9;
- the fold there as the IEEE products (one stage): folding rows as fast as today's (p = 14, batch 64 / 256:
  174.7 / 665.4 at 2 heads a program against 173.2 / 639.8), but the kernel compiled otherwise and the rows
  that do not fold lost the gain: 84.4 / 311.6 at 8 heads; ops_mamba2.py's replay verify + accept 0.038 /
  0.132 / 0.404 ms at batch 16 / 64 / 256 against 0.033 / 0.099 / 0.380.
So the fold now is a launch of its own, after this one (which reads the checkpoint and writes only the other
history buffer of a folding row): the heads kernel compiles to 208 registers and 48 KB of shared memory, the
fold kernel to 128 and 24 KB, neither spilling (benchmarks/kernel_registers.py, sm_90). As it stands (H100,
session 56, `bash benchmarks/gpu/mamba2_heads.sh`, 155 s; today's kernel in the same call 84.2-84.3 / 304.6-306.2
where no row folds, 171.5-173.0 / 644.0-646.0 where every row does), us at batch 64 / 256 at 8 heads a program,
FOLD_RUN 1 / 4 / 8: no row folds 70.5 / 252.6, 66.2 / 238.8, 66.6 / 236.5; every row folds 170.1 / 639.2,
177.4 / 652.2, 190.2 / 661.6. ops_mamba2.py's replay verify + accept (rows folding at the benchmark's rates), ms
at batch 1 / 16 / 64 / 256: FOLD_RUN 1 0.009 / 0.030 / 0.088 / 0.343, FOLD_RUN 4 0.009 / 0.043 / 0.096 / 0.348,
today's kernel 0.008 / 0.033 / 0.099 / 0.380. So FOLD_RUN stays 1 and `triton_verify.HEADS` is on, from
`triton_verify.HEADS_FROM` rows (16: below, this form lost by 0.001 ms; at batch 32 it won, 0.050 against 0.057).

Nor did a register cap on the heads launch pay (Triton's maxnreg 168: three 4-warp programs an SM where 208
registers allow two; 88 bytes a thread spilled), nor each head asking L2 for the next head's tile before its
products (prefetch.global.L2, no register held; history 6791f9e). H100, session 59, one call: ops_mamba2.py's replay
verify + accept, ms at batch 16 / 64 / 256, neither 0.030 / 0.085 / 0.337, cap 0.035 / 0.110 / 0.373, prefetch
0.030 / 0.086 / 0.339, both 0.036 / 0.108 / 0.376; tune_mamba2_verify.py at 8 heads x 4 warps, us at batch 64 /
256 where no row folds 70.6 / 252.8, 94.6 / 289.8, 72.4 / 255.1, 93.9 / 295.7, and where every row folds 162.2 /
629.4, 184.6 / 660.8, 164.5 / 633.1, 186.9 / 675.1. Nsight Compute's stall samples at batch 64 (stalls.sh): 12.5%
occupancy, 6.9 cycles a warp between issues, 39% of the samples waiting on global loads, 31% at one instruction,
the first use of the head's cumulative decays (c_last), whose load follows the head's 32 KB tile: each head waits
out its tile's round trip while the SM's one other program is all that runs.

Nor did loading each head's history before its tile, so that its weights form while the tile arrives (history
94e78bd), nor the head loop in Triton's software pipeline now that the fold is a launch of its own (the next heads'
tiles copied into shared memory by cp.async). H100, session 60, one call (benchmarks/gpu/mamba2_heads.sh):
ops_mamba2.py's replay verify + accept, ms at batch 16 / 64 / 256, one stage (today's) 0.030 / 0.085 / 0.337, two
0.031 / 0.104 / 0.412, three 0.039 / 0.118 / 0.460, history first 0.029 / 0.085 / 0.337, history first at two
stages 0.031 / 0.106 / 0.427; tune_mamba2_verify.py at 8 heads x 4 warps, us at batch 64 / 256 where no row folds
70.1 / 253.1, 87.9 / 323.6, 101.5 / 371.7, 70.2 / 253.2, 90.2 / 341.9, and where every row folds 162.6 / 630.0,
179.2 / 695.9, 191.6 / 751.3, 162.9 / 632.1, 174.1 / 699.3. Batch 64 is 2,056 GB/s, 68% of the 3,003-3,026 GB/s
copy bandwidth measured in the same call.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridcache.ops.mamba2.triton_verify import BLOCK_H, _history_sum, softplus
from hybridcache.ops.pdl_triton import pdl_entry, pdl_launch
from hybridcache.ops.triton_support import num_sms

# the head loop's pipeline: 2 and 3 were slower, with the fold inside this kernel (session 55) and without it
# (session 60; the module's figures)
NUM_STAGES = 1
# heads a fold program (where it divides H, else 1): at 1 a folding row's heads run side by side, but the B·H
# programs each load a row's slot and pnat before those of rows that do not fold exit; more heads a program,
# fewer such programs. 1 was the fastest in ops_mamba2.py's mix of rows (the module's figures)
FOLD_RUN = 1


@triton.jit
def _tokens_by_channel(ch, cb, xs_new, dtp, a, tt, PRECISION: tl.constexpr):
    """`triton_verify._tokens_closed_form` by channel: ch [BLOCK_P, TP] (h[p]·C_t), xs_new [BLOCK_P, TP] and
    cb [TP, TP] (C_t·B_s) -> y [BLOCK_P, TP] fp32 and c [TP]."""
    c = tl.cumsum(dtp * a, 0)
    decay = tl.where(tt[None, :] <= tt[:, None], tl.exp(c[:, None] - c[None, :]), 0.0)  # (t, s)
    mix = decay * cb * dtp[None, :]
    y = tl.exp(c)[None, :] * ch + tl.dot(xs_new.to(tl.float32), tl.trans(mix), input_precision=PRECISION)
    return y, c


@triton.jit
def _weighted_history(rx_ptr, rdt_ptr, rcum_ptr, sc, buf, head, rx_s, rx_b, rx_h, rx_t, rx_p, rd_s, rd_b, rd_h, rd_t,
                      rc_s, rc_b, rc_h, rc_t, jj, j_ok, count, pp, p_ok):
    """A head's history in buffer `buf`, tokens jj [HIST_P] masked at `count`: c_last (the cumsum at count − 1, 0
    with none) and its x weighted by w_j = e^{c_last − c_j}·dt_j, [BLOCK_P, HIST_P] fp32 (zeros past count;
    every load masked, never multiplied by zero)."""
    c_hist = tl.load(rcum_ptr + sc * rc_s + buf * rc_b + head * rc_h + jj * rc_t, mask=j_ok, other=0.0)
    d_hist = tl.load(rdt_ptr + sc * rd_s + buf * rd_b + head * rd_h + jj * rd_t, mask=j_ok, other=0.0)
    xh = tl.load(rx_ptr + sc * rx_s + buf * rx_b + head * rx_h + jj[None, :] * rx_t + pp[:, None] * rx_p,
                 mask=p_ok[:, None] & j_ok[None, :], other=0.0)
    c_last = tl.sum(tl.where(jj == count - 1, c_hist.to(tl.float32), 0.0), 0)
    w = tl.where(j_ok, tl.exp(c_last - c_hist.to(tl.float32)) * d_hist.to(tl.float32), 0.0)
    return c_last, xh.to(tl.float32) * w[None, :]


@triton.jit
def _heads_kernel(
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
    STEPS: tl.constexpr, HEAD_DIM: tl.constexpr, DSTATE: tl.constexpr, REPS: tl.constexpr, RUN: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HIST_P: tl.constexpr, TP: tl.constexpr,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program a (row, group, run of RUN consecutive heads of the group) on a grid (B, G, REPS / RUN)."""
    pdl_entry(PDL)
    row, group, run = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slot_ptr + row * s_slot).to(tl.int64)
    valid = slot >= 0
    sc = tl.maximum(slot, 0)
    p = tl.load(pnat_ptr + sc * s_pnat, mask=valid, other=0).to(tl.int32)
    buf = tl.load(buf_ptr + sc * s_buf, mask=valid, other=0).to(tl.int64)
    fold = valid & (p + STEPS > hist)
    count = tl.minimum(p, hist)  # history tokens read (p <= HIST by contract; the min keeps loads in bounds)
    target = tl.where(fold, 1 - buf, buf)
    start = tl.where(fold, 0, p).to(tl.int64)

    pp = tl.arange(0, BLOCK_P)
    p_ok = pp < HEAD_DIM
    nn = tl.arange(0, BLOCK_N)
    n_ok = nn < DSTATE
    tile_ok = p_ok[:, None] & n_ok[None, :]
    tt = tl.arange(0, TP)
    t_ok = tt < STEPS
    jj = tl.arange(0, HIST_P)
    j_ok = jj < count

    # the group's rows, once: new B and C, the history's B, and their products with C
    tn_ok = t_ok[:, None] & n_ok[None, :]
    bs_new = tl.load(B_ptr + row * sB_b + tt[:, None] * sB_t + group * sB_g + nn[None, :] * sB_n, mask=tn_ok,
                     other=0.0)
    cf = tl.load(C_ptr + row * sC_b + tt[:, None] * sC_t + group * sC_g + nn[None, :] * sC_n, mask=tn_ok,
                 other=0.0).to(tl.float32)
    rb_row = rb_ptr + sc * rb_s + buf * rb_b + group * rb_g
    bh = tl.load(rb_row + jj[:, None] * rb_t + nn[None, :] * rb_n, mask=j_ok[:, None] & n_ok[None, :],
                 other=0.0).to(tl.float32)
    cb_hist = tl.dot(cf, tl.trans(bh), input_precision=PRECISION)  # (t, j): C_t·B_j
    cb_new = tl.dot(cf, tl.trans(bs_new.to(tl.float32)), input_precision=PRECISION)  # (t, s): C_t·B_s
    pos = start + tt
    wb_row = rb_ptr + sc * rb_s + target * rb_b + group * rb_g
    tl.store(wb_row + pos[:, None] * rb_t + nn[None, :] * rb_n, bs_new.to(rb_ptr.dtype.element_ty),
             mask=tn_ok & valid & (run == 0))

    pt_ok = p_ok[:, None] & t_ok[None, :]
    for r in tl.range(0, RUN, num_stages=NUM_STAGES):
        head = group * REPS + run * RUN + r
        h = tl.load(ssm_ptr + sc * ss_s + head * ss_h + pp[:, None] * ss_p + nn[None, :] * ss_n,
                    mask=tile_ok & valid, other=0.0)
        c_last, xw = _weighted_history(rx_ptr, rdt_ptr, rcum_ptr, sc, buf, head, rx_s, rx_b, rx_h, rx_t, rx_p,
                                       rd_s, rd_b, rd_h, rd_t, rc_s, rc_b, rc_h, rc_t, jj, j_ok, count, pp, p_ok)
        xs_new = tl.load(x_ptr + row * sx_b + tt[None, :] * sx_t + head * sx_h + pp[:, None] * sx_p, mask=pt_ok,
                         other=0.0)  # [BLOCK_P, TP]
        raw = tl.load(dt_ptr + row * sd_b + tt * sd_t + head * sd_h, mask=t_ok, other=0.0).to(tl.float32)
        e_last = tl.exp(c_last)
        # by channel (p, t): the tile is a product's first operand, 64 rows a warpgroup
        ch = e_last * tl.dot(h, tl.trans(cf), input_precision=PRECISION)  # e^{c_last}·h[p]·C_t
        ch = tl.dot(xw, tl.trans(cb_hist), acc=ch, input_precision=PRECISION)
        if HAS_BIAS:
            raw += tl.load(bias_ptr + head).to(tl.float32)
        dtp = tl.minimum(tl.maximum(softplus(raw), dt_lo), dt_hi)
        y, c = _tokens_by_channel(ch, cb_new, xs_new, dtp, tl.load(A_ptr + head).to(tl.float32), tt, PRECISION)
        if HAS_D:
            y += tl.load(D_ptr + head).to(tl.float32) * xs_new.to(tl.float32)
        tl.store(y_ptr + row * sy_b + tt[None, :] * sy_t + head * sy_h + pp[:, None], y.to(y_ptr.dtype.element_ty),
                 mask=pt_ok)
        # appended at [start, start + T) of buffer `target`; the running sum continues c_last or restarts at 0
        wx_row = rx_ptr + sc * rx_s + target * rx_b + head * rx_h
        tl.store(wx_row + pos[None, :] * rx_t + pp[:, None] * rx_p, xs_new.to(rx_ptr.dtype.element_ty),
                 mask=pt_ok & valid)
        tl.store(rdt_ptr + sc * rd_s + target * rd_b + head * rd_h + pos * rd_t, dtp.to(rdt_ptr.dtype.element_ty),
                 mask=t_ok & valid)
        tl.store(rcum_ptr + sc * rc_s + target * rc_b + head * rc_h + pos * rc_t,
                 (tl.where(fold, 0.0, c_last) + c).to(rcum_ptr.dtype.element_ty), mask=t_ok & valid)


@triton.jit
def _fold_run(ssm_ptr, rx_ptr, rb_ptr, rdt_ptr, rcum_ptr, buf_ptr, sc, run, hist, p,
              ss_s, ss_h, ss_p, ss_n, rx_s, rx_b, rx_t, rx_h, rx_p, rb_s, rb_b, rb_t, rb_g, rb_n,
              rd_s, rd_b, rd_h, rd_t, rc_s, rc_b, rc_h, rc_t, s_buf,
              HEAD_DIM: tl.constexpr, DSTATE: tl.constexpr, REPS: tl.constexpr, RUN: tl.constexpr,
              BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):
    """Slot sc folds (p history tokens in its buffer): ssm[sc, head] <- h_eff = e^{c_last}·h + Σ_j w_j·x_j·B_jᵀ for
    the RUN heads of `run`, in IEEE fp32 (`triton_verify._history_sum`)."""
    buf = tl.load(buf_ptr + sc * s_buf).to(tl.int64)
    count = tl.minimum(p, hist)
    pp = tl.arange(0, BLOCK_P)
    p_ok = pp < HEAD_DIM
    nn = tl.arange(0, BLOCK_N)
    n_ok = nn < DSTATE
    tile_ok = p_ok[:, None] & n_ok[None, :]
    for r in range(0, RUN):
        head = run * RUN + r
        rx_row = rx_ptr + sc * rx_s + buf * rx_b + head * rx_h
        rb_row = rb_ptr + sc * rb_s + buf * rb_b + (head // REPS) * rb_g
        rd_row = rdt_ptr + sc * rd_s + buf * rd_b + head * rd_h
        rc_row = rcum_ptr + sc * rc_s + buf * rc_b + head * rc_h
        c_last = tl.load(rc_row + (count - 1) * rc_t, mask=count > 0, other=0.0).to(tl.float32)
        acc = _history_sum(rx_row, rb_row, rd_row, rc_row, rx_t, rx_p, rb_t, rb_n, rd_t, rc_t, count, c_last,
                           pp, p_ok, nn, n_ok, BLOCK_P, BLOCK_N, BLOCK_H)
        tile = ssm_ptr + sc * ss_s + head * ss_h + pp[:, None] * ss_p + nn[None, :] * ss_n
        tl.store(tile, tl.load(tile, mask=tile_ok, other=0.0) * tl.exp(c_last) + acc, mask=tile_ok)


@triton.jit
def _fold_kernel(
    ssm_ptr, rx_ptr, rb_ptr, rdt_ptr, rcum_ptr, pnat_ptr, buf_ptr, slot_ptr, hist,
    ss_s, ss_h, ss_p, ss_n,
    rx_s, rx_b, rx_t, rx_h, rx_p,
    rb_s, rb_b, rb_t, rb_g, rb_n,
    rd_s, rd_b, rd_h, rd_t,
    rc_s, rc_b, rc_h, rc_t,
    s_pnat, s_buf, s_slot,
    STEPS: tl.constexpr, HEAD_DIM: tl.constexpr, DSTATE: tl.constexpr, REPS: tl.constexpr, RUN: tl.constexpr,
    RUNS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):
    """After `_heads_kernel` (which read the checkpoint and wrote only the other history buffer): `_fold_run` for
    each folding row's RUNS runs of RUN heads; any other row stores nothing. One program a (row, run) on a grid
    (B, RUNS), the last heads first: the heads launch's programs run a group after another, so the last groups'
    checkpoints are those it read last, the likeliest still in L2 when the fold reads them again. (H100, session
    58, benchmarks/gpu/mamba2_heads.sh: us where every row folds, batch 64 / 256, 162.6 / 633.3 against 170.8 /
    641.5 first heads first; ops_mamba2.py's replay verify + accept, ms at batch 64 / 256, 0.086 / 0.339 against
    0.087 / 0.343. In the same call, two forms lost and went: a fixed grid of 3 programs an SM sharing out the
    folding rows, 65.9 against 69.3 us at batch 64 where no row folds but 180.1 against 170.8 where all do, ops
    0.090 / 0.357 ms; and the heads launch taking the folding rows last (its grid ranking the rows), ops 0.107 /
    0.345 ms, 89.3 us where no row folds. History: 3ad45b5.)"""
    pdl_entry(PDL)
    row, run = tl.program_id(0).to(tl.int64), RUNS - 1 - tl.program_id(1)
    slot = tl.load(slot_ptr + row * s_slot).to(tl.int64)
    valid = slot >= 0
    sc = tl.maximum(slot, 0)
    p = tl.load(pnat_ptr + sc * s_pnat, mask=valid, other=0).to(tl.int32)
    if valid & (p + STEPS > hist):
        _fold_run(ssm_ptr, rx_ptr, rb_ptr, rdt_ptr, rcum_ptr, buf_ptr, sc, run, hist, p,
                  ss_s, ss_h, ss_p, ss_n, rx_s, rx_b, rx_t, rx_h, rx_p, rb_s, rb_b, rb_t, rb_g, rb_n,
                  rd_s, rd_b, rd_h, rd_t, rc_s, rc_b, rc_h, rc_t, s_buf,
                  HEAD_DIM, DSTATE, REPS, RUN, BLOCK_P, BLOCK_N, BLOCK_H)


def default_run(rows: int, groups: int, reps: int, sms: int) -> int:
    """Heads a program, a divisor of the group's `reps`: all of them, or the next divisor down while the grid has
    fewer programs than SMs. (H100, 132 SMs, batch 16 (128 (row, group) pairs), us at 1 / 2 / 4 / 8 heads a
    program: 20.8 / 19.7 / 16.5 / 24.0 with the fold in the kernel at two stages, - / 22.3 / 19.0 / 27.2 at one
    stage with its IEEE fold: 4 heads, 256 programs, where two programs an SM had asked for 2.)"""
    run = reps
    while run > 1 and rows * groups * (reps // run) < sms:
        run = max(d for d in range(1, run) if reps % d == 0)
    return run


def mamba2_verify_heads_triton(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, ssm: Tensor, replay_x: Tensor,
                               replay_B: Tensor, replay_dt: Tensor, replay_dA_cumsum: Tensor, pnat: Tensor,
                               buf_idx: Tensor, slots: Tensor, D: Tensor | None, dt_bias: Tensor | None,
                               dt_limit: tuple[float, float], run: int | None = None,
                               num_warps: int | None = None) -> Tensor:
    """Two launches (the second stores the folding rows' checkpoints); the arguments, writes and result of
    `triton_verify.mamba2_verify_triton` (whose checks it assumes done; HIST <= triton_verify.MAX_HIST, H a
    multiple of G). `run`: heads a program (a divisor of H / G), by default `default_run`."""
    batch, steps, heads, head_dim = x.shape
    groups, dstate = B.shape[2:]
    hist = replay_x.shape[2]
    reps = heads // groups
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if batch == 0 or steps == 0:
        return y
    if run is None:
        run = default_run(batch, groups, reps, num_sms(x.device))
    if run < 1 or reps % run:
        raise ValueError(f"run {run} does not divide the {reps} heads of a group")
    A = A.contiguous()
    block_p, block_n = max(16, triton.next_power_of_2(head_dim)), max(16, triton.next_power_of_2(dstate))
    pool = (*ssm.stride(), *replay_x.stride(), *replay_B.stride(), *replay_dt.stride(), *replay_dA_cumsum.stride(),
            pnat.stride(0), buf_idx.stride(0), slots.stride(0))
    _heads_kernel[(batch, groups, reps // run)](
        x, dt, A, B, C, A if D is None else D.contiguous(), A if dt_bias is None else dt_bias.contiguous(),
        ssm, replay_x, replay_B, replay_dt, replay_dA_cumsum, pnat, buf_idx, slots, y,
        float(dt_limit[0]), float(dt_limit[1]), hist,
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *pool, *y.stride()[:3],
        STEPS=steps, HEAD_DIM=head_dim, DSTATE=dstate, REPS=reps, RUN=run, BLOCK_P=block_p, BLOCK_N=block_n,
        HIST_P=max(16, triton.next_power_of_2(hist)), TP=max(16, triton.next_power_of_2(steps)),
        HAS_D=D is not None, HAS_BIAS=dt_bias is not None,
        PRECISION="tf32x3" if x.dtype == torch.float32 else "tf32", NUM_STAGES=NUM_STAGES, **pdl_launch(x),
        **({"num_warps": num_warps} if num_warps else {}),
    )
    fold_run = FOLD_RUN if heads % FOLD_RUN == 0 else 1
    runs = heads // fold_run
    _fold_kernel[(batch, runs)](
        ssm, replay_x, replay_B, replay_dt, replay_dA_cumsum, pnat, buf_idx, slots, hist, *pool,
        STEPS=steps, HEAD_DIM=head_dim, DSTATE=dstate, REPS=reps, RUN=fold_run, RUNS=runs, BLOCK_P=block_p,
        BLOCK_N=block_n, BLOCK_H=BLOCK_H, **pdl_launch(x),
    )
    return y
