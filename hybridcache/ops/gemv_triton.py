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

import torch
import triton
import triton.language as tl
from torch import Tensor

from .pdl_triton import pdl_entry, pdl_launch

MAX_ROWS = 4
# 4 x 1,024 weight elements a step: 64 bytes of loads a thread in flight at 4 warps, and 512 programs for a
# 2,048-column output. Timed alone (benchmarks/ops_linear.py --sweep, H100) 8 x 256 was faster on half the
# decode shapes, but in the batch-1 graph steps it lost by far: nemotron_h 885 tok/s against 1,239, qwen3_next
# 1,029 against 1,215 (alone, a weight that fits in L2 is read from it again: several shapes beat the copy bandwidth)
BLOCK_N = 4
BLOCK_K = 1024
NUM_WARPS = 4
# Unrolling the loop over K at compile time (K a constant of the launch) did not pay either: sm_90 issued the second
# step's weight loads only as registers freed, no more of them in flight; H100, qwen3_next's batch-1 graph step
# (benchmarks/gpu/gemv_steps.sh, session 51, history 35250ef) 1,120 tok/s against 1,128 rolled, the gemvs' GPU
# time 0.384 against 0.369 ms.
# a [64, 64] tile where a batched weight's output columns are its unit-stride dimension (4,096 elements a step,
# as BLOCK_N x BLOCK_K): 256 bytes of each of 64 weight rows
BATCHED_TILE = 64
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
def _store_row(y_ptr, b_ptr, acc, r, M, s_ym, nn, n_ok, X_DTYPE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """y[r, nn] = Σ_k acc (+ bias), rounded once to x's dtype X_DTYPE, then stored in y's (the same, or wider)."""
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + nn, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + r * s_ym + nn, y.to(X_DTYPE).to(y_ptr.dtype.element_ty), mask=n_ok & (r < M))


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, s_xm, s_wn, s_ym, s_xb, s_wb, s_yb, s_wk,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    BATCHED: tl.constexpr, PDL: tl.constexpr,
):
    """x [M, K], w [N, K], y [M, N] by their row strides (unit last); b [N] where HAS_BIAS; ROWS (1 to 4) >= M.
    One [BLOCK_N, BLOCK_K] accumulator a row, all in the weight block's layout. BATCHED: product program_id(1)
    of a batch, x, w and y offset by it times s_xb, s_wb, s_yb, and w's columns s_wk apart (either of w's strides
    may be the unit one); otherwise those four are unused."""
    if BATCHED:
        batch = tl.program_id(1).to(tl.int64)
        x_ptr += batch * s_xb
        w_ptr += batch * s_wb
        y_ptr += batch * s_yb
    pdl_entry(PDL)
    nn = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = nn < N
    acc0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        w_cols = kk * s_wk if BATCHED else kk
        w = tl.load(w_ptr + nn[:, None] * s_wn + w_cols[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        w = w.to(tl.float32)
        acc0 += w * _x_row(x_ptr, 0, M, s_xm, nn, kk, k_ok)
        if ROWS > 1:
            acc1 += w * _x_row(x_ptr, 1, M, s_xm, nn, kk, k_ok)
        if ROWS > 2:
            acc2 += w * _x_row(x_ptr, 2, M, s_xm, nn, kk, k_ok)
            acc3 += w * _x_row(x_ptr, 3, M, s_xm, nn, kk, k_ok)
    X_DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    _store_row(y_ptr, b_ptr, acc0, 0, M, s_ym, nn, n_ok, X_DTYPE, HAS_BIAS)
    if ROWS > 1:
        _store_row(y_ptr, b_ptr, acc1, 1, M, s_ym, nn, n_ok, X_DTYPE, HAS_BIAS)
    if ROWS > 2:
        _store_row(y_ptr, b_ptr, acc2, 2, M, s_ym, nn, n_ok, X_DTYPE, HAS_BIAS)
        _store_row(y_ptr, b_ptr, acc3, 3, M, s_ym, nn, n_ok, X_DTYPE, HAS_BIAS)


def gemv_triton(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """`F.linear(x, weight, bias)` for x [M, K] with M <= MAX_ROWS, weight [N, K], bias [N] or None -> [M, N] in
    x's dtype; fp32 accumulation, so the values agree with cuBLAS's within one rounding of the result.
    `out_dtype` (float32, or x's dtype: the default): the result rounded to x's dtype, stored in it (`.float()` of
    the result, in the same launch). `block_n`, `block_k` (powers of two), `num_warps`: the tiling (defaults
    BLOCK_N (`_block_n`), BLOCK_K, NUM_WARPS), which changes the result only within rounding."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: need [M, K] and [N, K]")
    M, K = x.shape
    N = weight.shape[0]
    if M > MAX_ROWS:
        raise ValueError(f"gemv_triton takes at most {MAX_ROWS} rows, got {M}")
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias {tuple(bias.shape)}: need [{N}]")
    if out_dtype not in (None, x.dtype, torch.float32):
        raise ValueError(f"out_dtype {out_dtype}: x's dtype ({x.dtype}) or torch.float32")
    y = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.copy_(bias.expand(M, N).to(x.dtype) if bias is not None else torch.zeros_like(y))
    x = x if x.stride(1) == 1 else x.contiguous()
    weight = weight if weight.stride(1) == 1 else weight.contiguous()
    bn = _block_n(x, N, block_n)
    bk = min(block_k or BLOCK_K, max(16, triton.next_power_of_2(K)))
    _gemv_kernel[(triton.cdiv(N, bn),)](
        x, weight, weight if bias is None else bias, y, M, N, K, x.stride(0), weight.stride(0), y.stride(0),
        0, 0, 0, 1, ROWS=triton.next_power_of_2(M), BLOCK_N=bn, BLOCK_K=bk, HAS_BIAS=bias is not None,
        BATCHED=False, num_warps=num_warps or NUM_WARPS, **pdl_launch(x),
    )
    return y


def bmm_rows_triton(x: Tensor, weight: Tensor) -> Tensor:
    """`torch.bmm(x, weight.transpose(1, 2))` for x [B, M, K] with M <= MAX_ROWS, weight [B, N, K] -> [B, M, N]
    in x's dtype, one launch on a grid (output blocks, B); fp32 accumulation, rounded once, as `gemv_triton`.
    x is read in place where its last stride is 1; the weight where its rows are contiguous (read as
    `gemv_triton` reads them) or its columns are (a transposed view of a [B, K, N] tensor, read in [BATCHED_TILE,
    BATCHED_TILE] tiles); other layouts are copied first."""
    if x.dim() != 3 or weight.dim() != 3 or x.shape[0] != weight.shape[0] or x.shape[2] != weight.shape[2]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: need [B, M, K] and [B, N, K]")
    B, M, K = x.shape
    N = weight.shape[1]
    if M > MAX_ROWS:
        raise ValueError(f"bmm_rows_triton takes at most {MAX_ROWS} rows a product, got {M}")
    y = torch.empty(B, M, N, dtype=x.dtype, device=x.device)
    if y.numel() == 0 or K == 0:
        return y.zero_()
    x = x if x.stride(2) == 1 else x.contiguous()
    if weight.stride(2) != 1 and weight.stride(1) != 1:
        weight = weight.contiguous()
    rows_major = weight.stride(2) == 1  # the weight's rows contiguous, as gemv_triton reads them
    bn = _block_n(x, N, None) if rows_major else min(BATCHED_TILE, triton.next_power_of_2(N))
    bk = min(BLOCK_K if rows_major else BATCHED_TILE, max(16, triton.next_power_of_2(K)))
    _gemv_kernel[(triton.cdiv(N, bn), B)](
        x, weight, weight, y, M, N, K, x.stride(1), weight.stride(1), y.stride(1),
        x.stride(0), weight.stride(0), y.stride(0), weight.stride(2), ROWS=triton.next_power_of_2(M), BLOCK_N=bn,
        BLOCK_K=bk, HAS_BIAS=False, BATCHED=True, num_warps=NUM_WARPS, **pdl_launch(x),
    )
    return y
