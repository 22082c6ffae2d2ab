"""`x @ weight.T (+ bias)` for a few rows (decode at batch 1 to 4) as one Triton launch with no tensor cores:
a weight read once at the bandwidth limit is the whole cost there, and cuBLAS's picks for those shapes (split-K
plus a reduce kernel: two launches) read it at about half the copy bandwidth inside a decode step
(benchmarks/ops_linear.py has the shapes).

A program takes BLOCK_N output columns over the whole width: each step loads a [BLOCK_N, BLOCK_K] block of the
weight and, for each row of x, its BLOCK_K columns in that block's layout, and adds their elementwise products
(fp32) into the row's [BLOCK_N, BLOCK_K] accumulator, reduced over BLOCK_K once at the end; no program depends
on another. The result is rounded to x's dtype once, after the bias (fp32). (Held as one [rows, BLOCK_N,
BLOCK_K] accumulator instead, the weight and x blocks went through shared memory every step, four barriers a
step at sm_90.)
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .conv1d.triton_conv import gemv_conv_update, gemv_conv_window
from .pdl_triton import pdl_entry, pdl_launch
from .rms_norm_triton import _round

MAX_ROWS = 4
NONE, RELU2 = tl.constexpr(0), tl.constexpr(1)  # the output's activation (ACT)
ACTIVATIONS = {None: NONE, "relu2": RELU2}
# 4 x 1,024 weight elements a step: 64 bytes of loads a thread in flight at 4 warps, and 512 programs for a
# 2,048-column output. Timed alone (benchmarks/ops_linear.py --sweep, H100) 8 x 256 was faster on half the
# decode shapes, but in the batch-1 graph steps it lost by far: nemotron_h 885 tok/s against 1,239, qwen3_next
# 1,029 against 1,215 (alone, a weight that fits in L2 is read from it again: several shapes beat the copy bandwidth)
BLOCK_N = 4
BLOCK_K = 1024
NUM_WARPS = 4
# Triton's CPU interpreter runs programs one by one at a fixed cost each: there a program takes up to this many
# outputs (the tiny test models' whole GEMM, in one to a few programs), the same values within summation order
INTERPRETER_BLOCK_N = 64


def _block_n(x: Tensor, N: int, block_n: int | None) -> int:
    """Outputs a program: `block_n`, else BLOCK_N on a GPU and up to INTERPRETER_BLOCK_N in the interpreter."""
    return block_n or (BLOCK_N if x.is_cuda else min(INTERPRETER_BLOCK_N, max(BLOCK_N, triton.next_power_of_2(N))))


@triton.jit
def _x_row(x_ptr, r, M, s_xm, nn, kk, k_ok):
    """Row r of x at columns kk, fp32, loaded as [BLOCK_N, BLOCK_K] (every column block row the same: the weight
    block's own layout, so no shared-memory round trip to broadcast it); zeros past M."""
    return tl.load(x_ptr + r * s_xm + (kk[None, :] + 0 * nn[:, None]), mask=(r < M) & k_ok[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _row_value(b_ptr, acc, nn, n_ok, DTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """Σ_k acc (+ bias) converted once to DTYPE (as stored: the interpreter truncates where the GPU rounds), then
    (ACT == RELU2) relu(·)² rounded again: fp32 holding DTYPE values, what `relu2_triton` makes of the stored
    product."""
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + nn, mask=n_ok, other=0.0).to(tl.float32)
    y = y.to(DTYPE).to(tl.float32)
    if ACT == RELU2:
        y = tl.maximum(y, 0.0)
        y = _round(y * y, DTYPE)
    return y


@triton.jit
def _store_row(y_ptr, b_ptr, acc, r, M, s_ym, nn, n_ok, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """y[r, nn] = `_row_value`."""
    y = _row_value(b_ptr, acc, nn, n_ok, y_ptr.dtype.element_ty, HAS_BIAS, ACT)
    tl.store(y_ptr + r * s_ym + nn, y.to(y_ptr.dtype.element_ty), mask=n_ok & (r < M))


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, s_xm, s_wn, s_ym,
    conv_ptr, cw_ptr, cb_ptr, slot_ptr, conv_start, conv_channels, s_cwc, s_cwk, s_ss, s_sc, s_sj,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    CONV_WIDTH: tl.constexpr, CONV_BIAS: tl.constexpr, CONV_SILU: tl.constexpr, PDL: tl.constexpr,
):
    """x [M, K], w [N, K], y [M, N] by their row strides (unit last); b [N] where HAS_BIAS; ROWS (1 to 4) >= M.
    One [BLOCK_N, BLOCK_K] accumulator a row, all in the weight block's layout. ACT: the output's activation
    (NONE, RELU2). CONV_WIDTH > 0 (one row): columns conv_start .. + conv_channels are a causal conv's input,
    replaced by its update's output (`gemv_conv_update`; conv_ptr the role [S, C, W + k], cw_ptr its taps [C,
    WIDTH], cb_ptr its bias where CONV_BIAS, slot_ptr the row's slot)."""
    pdl_entry(PDL)
    nn = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = nn < N
    if CONV_WIDTH > 0:
        in_conv, c, live, win, taps, window = gemv_conv_window(conv_ptr, cw_ptr, slot_ptr, nn, conv_start,
                                                               conv_channels, s_cwc, s_cwk, s_ss, s_sc, s_sj,
                                                               CONV_WIDTH)
    acc0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        w = tl.load(w_ptr + nn[:, None] * s_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        w = w.to(tl.float32)
        acc0 += w * _x_row(x_ptr, 0, M, s_xm, nn, kk, k_ok)
        if ROWS > 1:
            acc1 += w * _x_row(x_ptr, 1, M, s_xm, nn, kk, k_ok)
        if ROWS > 2:
            acc2 += w * _x_row(x_ptr, 2, M, s_xm, nn, kk, k_ok)
            acc3 += w * _x_row(x_ptr, 3, M, s_xm, nn, kk, k_ok)
    if CONV_WIDTH > 0:
        y = _row_value(b_ptr, acc0, nn, n_ok, y_ptr.dtype.element_ty, HAS_BIAS, ACT)
        y = gemv_conv_update(y, in_conv, c, live, win, taps, window, s_sj, cb_ptr, CONV_WIDTH, CONV_BIAS, CONV_SILU)
        tl.store(y_ptr + nn, y.to(y_ptr.dtype.element_ty), mask=n_ok)
    else:
        _store_row(y_ptr, b_ptr, acc0, 0, M, s_ym, nn, n_ok, HAS_BIAS, ACT)
    if ROWS > 1:
        _store_row(y_ptr, b_ptr, acc1, 1, M, s_ym, nn, n_ok, HAS_BIAS, ACT)
    if ROWS > 2:
        _store_row(y_ptr, b_ptr, acc2, 2, M, s_ym, nn, n_ok, HAS_BIAS, ACT)
        _store_row(y_ptr, b_ptr, acc3, 3, M, s_ym, nn, n_ok, HAS_BIAS, ACT)


class ConvEpilogue(NamedTuple):
    """A causal conv update (`conv1d.causal_conv1d_update`, one token) on a one-row GEMM's output columns start
    .. start + C: taps weight [C, WIDTH], bias [C] or None, the conv role [S, C, W + k] (W = WIDTH - 1; its
    windows written in place), slots [1] (negative: a padding row), silu or no activation."""
    start: int
    weight: Tensor
    bias: Tensor | None
    conv: Tensor
    slots: Tensor
    silu: bool = True


def _check_conv(conv: ConvEpilogue, M: int, N: int) -> None:
    C, width = conv.weight.shape
    if M != 1:
        raise ValueError(f"a conv epilogue takes one row, got {M}")
    if not 0 <= conv.start <= N - C:
        raise ValueError(f"conv columns {conv.start} .. {conv.start + C} outside the output's {N}")
    if conv.conv.dim() != 3 or conv.conv.shape[1] != C or conv.conv.shape[2] < width - 1:
        raise ValueError(f"conv role {tuple(conv.conv.shape)}: need [S, {C}, >= {width - 1}]")
    if conv.bias is not None and conv.bias.shape != (C,):
        raise ValueError(f"conv bias {tuple(conv.bias.shape)}: need [{C}]")
    if conv.slots.numel() != 1:
        raise ValueError(f"a conv epilogue takes one slot, got {conv.slots.numel()}")


def gemv_triton(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    *,
    activation: str | None = None,
    conv: ConvEpilogue | None = None,
) -> Tensor:
    """`F.linear(x, weight, bias)` for x [M, K] with M <= MAX_ROWS, weight [N, K], bias [N] or None -> [M, N] in
    x's dtype; fp32 accumulation, so the values agree with cuBLAS's within one rounding of the result.
    `block_n`, `block_k` (powers of two), `num_warps`, `num_stages`: the tiling (defaults BLOCK_N (`_block_n`),
    BLOCK_K, NUM_WARPS, Triton's stages), which changes the result only within rounding.
    Epilogues, each the same values as the launch it replaces on this kernel's output: `activation` "relu2"
    (`activation_triton.relu2_triton`); `conv` (one row) the conv update of columns conv.start .. + C
    (`conv1d.triton_conv.causal_conv1d_update_triton`: those columns come out as its output, its windows shift)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: need [M, K] and [N, K]")
    M, K = x.shape
    N = weight.shape[0]
    if M > MAX_ROWS:
        raise ValueError(f"gemv_triton takes at most {MAX_ROWS} rows, got {M}")
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias {tuple(bias.shape)}: need [{N}]")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    if conv is not None:
        _check_conv(conv, M, N)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    if K == 0 and activation is None and conv is None:
        return y.copy_(bias.expand(M, N) if bias is not None else torch.zeros_like(y))
    x = x if x.stride(1) == 1 else x.contiguous()
    weight = weight if weight.stride(1) == 1 else weight.contiguous()
    bn = _block_n(x, N, block_n)
    bk = min(block_k or BLOCK_K, max(16, triton.next_power_of_2(K)))
    c = conv if conv is not None else ConvEpilogue(0, weight, None, weight[None], x)  # unused without CONV_WIDTH
    _gemv_kernel[(triton.cdiv(N, bn),)](
        x, weight, weight if bias is None else bias, y, M, N, K, x.stride(0), weight.stride(0), y.stride(0),
        c.conv, c.weight, c.weight if c.bias is None else c.bias, c.slots, c.start, c.weight.shape[0],
        *c.weight.stride(), *c.conv.stride(),
        ROWS=triton.next_power_of_2(M), BLOCK_N=bn, BLOCK_K=bk, HAS_BIAS=bias is not None,
        ACT=ACTIVATIONS[activation], CONV_WIDTH=0 if conv is None else c.weight.shape[1],
        CONV_BIAS=c.bias is not None, CONV_SILU=c.silu,
        num_warps=num_warps or NUM_WARPS, **({"num_stages": num_stages} if num_stages else {}), **pdl_launch(x),
    )
    return y
