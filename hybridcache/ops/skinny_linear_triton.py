"""`x @ weight.T` for a decode-sized x (M ≤ MAX_ROWS rows) as one Triton launch, with the activation that
follows it in the same launch: where cuBLAS spends a GEMM (two kernels when it splits K) and the
activation's own kernel, a batch-1 step spends one.

One program takes BLOCK_N output columns for all M rows and walks K in BLOCK_K steps, so each weight
element is read once. Below 16 rows the products accumulate in a [BLOCK_M, BLOCK_N, BLOCK_K] fp32 tile
(CUDA-core FMAs; reduced over K once, after the loop); from 16 rows `tl.dot` (tensor cores, fp32
accumulation; "ieee" for fp32 inputs, so fp32 stays fp32).

Epilogues, rounding where the unfused ops round (`rms_norm_triton._round`, nearest even), y in x's dtype:
  NONE      y = rnd(acc + bias)
  RELU2     y = rnd(relu(rnd(acc + bias))²)                  (`torch.square(F.relu(F.linear(...)))`)
  SILU_MUL  y = rnd(rnd(silu(rnd(acc_g))) · rnd(acc_u))      acc_g over rows n, acc_u over rows n + inner of
                                                             one gate/up weight (`activation_triton.silu_mul`)
The dot products sum in another order than cuBLAS, so a 16-bit result now and then lands one ulp away;
fp32 agrees to a few 1e-6 relative. No host sync: one allocation and one launch (CUDA-graph capturable).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .linear import ConvEpilogue
from .rms_norm_triton import _round, _silu
from .triton_dot import dot, dot_args
from .triton_support import interpreting, num_sms

NONE, RELU2, SILU_MUL = (tl.constexpr(e) for e in range(3))  # the kernel's EPILOGUE
EPILOGUES = {"none": NONE, "relu2": RELU2, "silu_mul": SILU_MUL}
MAX_ROWS = 16  # rows of x the kernel takes (a decode step's batch); above that cuBLAS
TILE = 4096  # fp32 products a program holds per K step below 16 rows (32 a thread at 4 warps)
INTERPRETER_TILE = 1 << 18  # the CPU interpreter pays per operation: big tiles there
_SUM = tl.standard._sum_combine  # tl.reduce with it: tl.sum without the nested jit call (interpreter cost)


@triton.jit
def _accumulate(x, w_ptr, rows, n_ok, k, k_ok, stride_wn, acc, DOT: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):
    """acc += x [BM, BK] times the weight rows `rows` [BN] at columns k [BK]."""
    if DOT:
        w = tl.load(w_ptr + rows[None, :] * stride_wn + k[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        acc = dot(x, w, acc, PRECISION, UPCAST)
    else:
        w = tl.load(w_ptr + rows[:, None] * stride_wn + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _conv_epilogue(y_ptr, n, n_ok, m, m_ok, stride_ym, cw_ptr, cb_ptr, conv_ptr, slots_ptr, c0, C,
                   stride_cwc, stride_cwk, stride_ss, stride_sc, stride_sj,
                   STEPS: tl.constexpr, WIDTH: tl.constexpr, BLOCK_J: tl.constexpr, CONV_BIAS: tl.constexpr,
                   CONV_SILU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Columns c0 .. c0 + C of y (already stored) through the causal conv of `triton_conv._update_kernel`:
    row m is token t = m % STEPS of batch row b = m // STEPS; tap i of token t reads seq = cat(window, x_b)
    at t + i. Writes the conv's outputs over those columns and seq[:, 1:] into the row's window."""
    W: tl.constexpr = WIDTH - 1
    KEEP: tl.constexpr = W + STEPS - 1
    Y: tl.constexpr = y_ptr.dtype.element_ty
    c = n - c0
    c_ok = n_ok & (c >= 0) & (c < C)
    c64 = tl.where(c_ok, c, 0).to(tl.int64)
    b, t = m // STEPS, m % STEPS
    slot = tl.load(slots_ptr + b, mask=m_ok, other=-1).to(tl.int64)
    live = m_ok & (slot >= 0)
    window = conv_ptr + (tl.maximum(slot, 0) * stride_ss)[:, None] + (c64 * stride_sc)[None, :]  # [BM, BN]
    x_rows = y_ptr + (b * STEPS).to(tl.int64)[:, None] * stride_ym + n[None, :]  # the row's first token
    tl.debug_barrier()  # the GEMM's stores above are seen by every thread of the program below
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for i in tl.static_range(WIDTH):
        pos = (t + i)[:, None]  # [BM, 1]
        in_win = pos < W
        old = tl.load(window + pos * stride_sj, mask=live[:, None] & in_win & c_ok[None, :], other=0.0)
        new = tl.load(x_rows + (pos - W) * stride_ym, mask=m_ok[:, None] & ~in_win & c_ok[None, :], other=0.0)
        w_i = tl.load(cw_ptr + c64 * stride_cwc + i * stride_cwk, mask=c_ok, other=0.0).to(tl.float32)
        acc += tl.where(in_win, old.to(tl.float32), new.to(tl.float32)) * w_i[None, :]
    if CONV_BIAS:
        acc += tl.load(cb_ptr + c64, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    if CONV_SILU:
        acc = acc * tl.sigmoid(acc)
    # seq[:, 1:] for the window, one row a batch row (its first token's): [BM, BN, BLOCK_J]
    j = tl.arange(0, BLOCK_J)[None, None, :]
    p = j + 1
    first = (live & (t == 0))[:, None, None] & c_ok[None, :, None] & (j < KEEP)
    kept_old = tl.load(window[:, :, None] + p * stride_sj, mask=first & (p < W), other=0.0)
    kept_new = tl.load(x_rows[:, :, None] + (p - W) * stride_ym, mask=first & (p >= W), other=0.0)
    kept = tl.where(p < W, kept_old.to(tl.float32), kept_new.to(tl.float32))
    tl.debug_barrier()  # every read of y's raw columns and of the window above happens before any store below
    tl.store(y_ptr + m[:, None].to(tl.int64) * stride_ym + n[None, :], acc.to(Y), mask=m_ok[:, None] & c_ok[None, :])
    tl.store(window[:, :, None] + j * stride_sj, kept.to(conv_ptr.dtype.element_ty), mask=first)


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, inner, stride_xm, stride_wn, stride_ym,
                   cw_ptr, cb_ptr, conv_ptr, slots_ptr, c0, C, stride_cwc, stride_cwk, stride_ss, stride_sc, stride_sj,
                   EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr, CONV: tl.constexpr, STEPS: tl.constexpr, WIDTH: tl.constexpr,
                   BLOCK_J: tl.constexpr, CONV_BIAS: tl.constexpr, CONV_SILU: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rows = n.to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    GATED: tl.constexpr = EPILOGUE == SILU_MUL
    if DOT:
        acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    else:
        acc = tl.full([BLOCK_M, BLOCK_N, BLOCK_K], 0.0, tl.float32)
    acc_u = acc
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(x_ptr + m[:, None].to(tl.int64) * stride_xm + k[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)
        acc = _accumulate(x, w_ptr, rows, n_ok, k, k_ok, stride_wn, acc, DOT, PRECISION, UPCAST)
        if GATED:
            acc_u = _accumulate(x, w_ptr, rows + inner, n_ok, k, k_ok, stride_wn, acc_u, DOT, PRECISION, UPCAST)
    if not DOT:
        acc = tl.reduce(acc, 2, _SUM)
        if GATED:
            acc_u = tl.reduce(acc_u, 2, _SUM)
    Y: tl.constexpr = y_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = _round(acc, Y)
    if EPILOGUE == RELU2:
        out = tl.maximum(out, 0.0)
        out = _round(out * out, Y)
    elif GATED:
        out = _round(_round(_silu(out), Y) * _round(acc_u, Y), Y)
    tl.store(y_ptr + m[:, None].to(tl.int64) * stride_ym + n[None, :], out.to(Y), mask=m_ok[:, None] & n_ok[None, :])
    if CONV:
        n0 = tl.program_id(0) * BLOCK_N
        if (n0 + BLOCK_N > c0) & (n0 < c0 + C):  # the program's columns meet the conv's
            _conv_epilogue(y_ptr, n, n_ok, m, m_ok, stride_ym, cw_ptr, cb_ptr, conv_ptr, slots_ptr, c0, C,
                           stride_cwc, stride_cwk, stride_ss, stride_sc, stride_sj, STEPS, WIDTH, BLOCK_J, CONV_BIAS,
                           CONV_SILU, BLOCK_M, BLOCK_N)


def blocks(M: int, N: int, K: int, sms: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) on a device of `sms` SMs: BLOCK_N the widest of 64 / 32 / 16 columns that
    still gives two programs an SM (at least 16); BLOCK_K what the FMA tile leaves (16 to 256), 64 with tl.dot
    (at 256 the gate/up pair's two tiles spill: `benchmarks/kernel_registers.py`).
    In the interpreter, big tiles (it pays per operation)."""
    bm = max(1, triton.next_power_of_2(M))
    if interpreting():
        bn = min(triton.next_power_of_2(N), 64)
        return bm, bn, max(16, min(triton.next_power_of_2(K), INTERPRETER_TILE // (bm * bn)))
    bn = 64
    while bn > 16 and triton.cdiv(N, bn) < 2 * sms:
        bn //= 2
    bk = 64 if bm >= 16 else max(16, min(256, TILE // (bm * bn)))
    return bm, bn, bk


def skinny_linear_triton(x: Tensor, weight: Tensor, bias: Tensor | None = None, epilogue: str = "none",
                         inner: int | None = None, block: tuple[int, int, int] | None = None,
                         conv: ConvEpilogue | None = None) -> Tensor:
    """x [M, K] (M ≤ MAX_ROWS, unit last stride, any row stride: a column slice is read in place); weight
    [N, K] of x's dtype, unit last stride; bias [N] or None. Returns a new contiguous y in x's dtype:
    [M, N] for "none" and "relu2"; for "silu_mul" [M, inner], the weight's rows [0, inner) the gate's and
    [inner, 2·inner) the up's (rows past 2·inner are not read; no bias). `block` (BLOCK_M, BLOCK_N,
    BLOCK_K) overrides `blocks`' choice; it does not change the result beyond the sum order.

    `conv` ("none" only): the output's columns conv.first .. + C then run through the causal depthwise conv
    of `causal_conv1d_update` over the slots' windows (x's rows are B batch rows of T tokens, b-major,
    B = len(conv.slots)), the same values as that op on those columns, windows written alike."""
    M, K = x.shape
    assert M <= MAX_ROWS and weight.shape[1] == K and x.dtype == weight.dtype, "x [M <= MAX_ROWS, K], weight [N, K]"
    assert x.stride(1) == 1 and weight.stride(1) == 1, "x and the weight need a unit last stride"
    gated = epilogue == "silu_mul"
    assert not gated or (inner is not None and 2 * inner <= weight.shape[0] and bias is None), "silu_mul: inner, no bias"
    assert bias is None or bias.shape == (weight.shape[0],)
    N = inner if gated else weight.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    bm, bn, bk = block or blocks(M, N, K, num_sms(x.device))
    dot = bm >= 16
    conv_args, conv_consts = _conv_args(conv, M, N, epilogue, y)
    _skinny_kernel[(triton.cdiv(N, bn),)](
        x, weight, weight if bias is None else bias, y, M, N, K, inner or 0, x.stride(0), weight.stride(0), y.stride(0),
        *conv_args, **conv_consts, EPILOGUE=EPILOGUES[epilogue], HAS_BIAS=bias is not None, DOT=dot,
        **dot_args(x), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
    )
    return y


def _conv_args(conv: ConvEpilogue | None, M: int, N: int, epilogue: str, y: Tensor) -> tuple[tuple, dict]:
    """The kernel's conv arguments (placeholders without one)."""
    if conv is None:
        return (y, y, y, y, 0, 0, 0, 0, 0, 0, 0), dict(CONV=False, STEPS=1, WIDTH=1, BLOCK_J=1, CONV_BIAS=False,
                                                      CONV_SILU=False)
    C, width = conv.weight.shape
    B = conv.slots.shape[0]
    assert epilogue == "none" and B and M % B == 0 and 0 <= conv.first and conv.first + C <= N, "conv: rows, columns"
    steps = M // B
    keep = width - 1 + steps - 1
    assert conv.state.shape[1] == C and conv.state.shape[2] >= keep, "conv state [S, C, >= W + T - 1]"
    slots = conv.slots.contiguous()
    return ((conv.weight, conv.weight if conv.bias is None else conv.bias, conv.state, slots, conv.first, C,
             *conv.weight.stride(), *conv.state.stride()),
            dict(CONV=True, STEPS=steps, WIDTH=width, BLOCK_J=triton.next_power_of_2(max(1, keep)),
                 CONV_BIAS=conv.bias is not None, CONV_SILU=conv.silu))
