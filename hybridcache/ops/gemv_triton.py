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
from .rms_norm_triton import (GROUP, SIGMOID, SILU, _TL_DTYPE, _norm_input, _norm_output, _norm_weight, _round, _silu,
                              _stream)

NONE, RELU2, SILU_MUL = (tl.constexpr(a) for a in range(3))  # the activation `_gemv_kernel` applies to x first
_ACT = {None: NONE, "relu2": RELU2, "silu_mul": SILU_MUL}

MAX_ROWS = 4
# 4 x 1,024 weight elements a step: 64 bytes of loads a thread in flight at 4 warps, and 512 programs for a
# 2,048-column output. Timed alone (benchmarks/ops_linear.py --sweep, H100) 8 x 256 was faster on half the
# decode shapes, but in the batch-1 graph steps it lost by far: nemotron_h 885 tok/s against 1,239, qwen3_next
# 1,029 against 1,215 (alone, a weight that fits in L2 is read from it again: several shapes beat the copy bandwidth)
BLOCK_N = 4
BLOCK_K = 1024
NUM_WARPS = 4
# `add_rms_norm_gemv_triton`'s step: it also loads the stream and the norm weight in the weight block's layout,
# so at 1,024 it compiles to 190 registers a thread (sm_90), at 512 to 94 (untimed)
NORM_BLOCK_K = 512
# Triton's CPU interpreter runs programs one by one at a fixed cost each: there a program takes up to this many
# outputs (the tiny test models' whole GEMM, in one to a few programs), the same values within summation order
INTERPRETER_BLOCK_N = 64


def _block_n(x: Tensor, N: int, block_n: int | None) -> int:
    """Outputs a program: `block_n`, else BLOCK_N on a GPU and up to INTERPRETER_BLOCK_N in the interpreter."""
    return block_n or (BLOCK_N if x.is_cuda else min(INTERPRETER_BLOCK_N, max(BLOCK_N, triton.next_power_of_2(N))))


@triton.jit
def _x_row(x_ptr, r, M, s_xm, nn, kk, k_ok, K, ACT: tl.constexpr):
    """Row r of act(x) at columns kk, fp32, loaded as [BLOCK_N, BLOCK_K] (every column block row the same: the
    weight block's own layout, so no shared-memory round trip to broadcast it); zeros past M. ACT RELU2:
    relu(x)²; SILU_MUL: silu(x[:, :K]) · x[:, K:2K]; each rounded to x's dtype where `activation_triton`'s kernels
    round, so the GEMM reads the values their launch would have stored."""
    at = x_ptr + r * s_xm + (kk[None, :] + 0 * nn[:, None])
    ok = (r < M) & k_ok[None, :]
    v = tl.load(at, mask=ok, other=0.0).to(tl.float32)
    X: tl.constexpr = x_ptr.dtype.element_ty
    if ACT == RELU2:
        v = _round(tl.maximum(v, 0.0) * tl.maximum(v, 0.0), X)
    elif ACT == SILU_MUL:
        up = tl.load(at + K, mask=ok, other=0.0).to(tl.float32)
        v = _round(_round(_silu(v), X) * up, X)
    return v


@triton.jit
def _store_row(y_ptr, b_ptr, acc, r, M, s_ym, nn, n_ok, HAS_BIAS: tl.constexpr):
    """y[r, nn] = Σ_k acc (+ bias), rounded once to y's dtype."""
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + nn, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + r * s_ym + nn, y.to(y_ptr.dtype.element_ty), mask=n_ok & (r < M))


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, s_xm, s_wn, s_ym,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    PDL: tl.constexpr,
):
    """y = act(x)·wᵀ: x [M, K] ([M, 2K] for SILU_MUL), w [N, K], y [M, N] by their row strides (unit last); b [N]
    where HAS_BIAS; ROWS (1 to 4) >= M. One [BLOCK_N, BLOCK_K] accumulator a row, all in the weight block's
    layout."""
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
        w = tl.load(w_ptr + nn[:, None] * s_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        w = w.to(tl.float32)
        acc0 += w * _x_row(x_ptr, 0, M, s_xm, nn, kk, k_ok, K, ACT)
        if ROWS > 1:
            acc1 += w * _x_row(x_ptr, 1, M, s_xm, nn, kk, k_ok, K, ACT)
        if ROWS > 2:
            acc2 += w * _x_row(x_ptr, 2, M, s_xm, nn, kk, k_ok, K, ACT)
            acc3 += w * _x_row(x_ptr, 3, M, s_xm, nn, kk, k_ok, K, ACT)
    _store_row(y_ptr, b_ptr, acc0, 0, M, s_ym, nn, n_ok, HAS_BIAS)
    if ROWS > 1:
        _store_row(y_ptr, b_ptr, acc1, 1, M, s_ym, nn, n_ok, HAS_BIAS)
    if ROWS > 2:
        _store_row(y_ptr, b_ptr, acc2, 2, M, s_ym, nn, n_ok, HAS_BIAS)
        _store_row(y_ptr, b_ptr, acc3, 3, M, s_ym, nn, n_ok, HAS_BIAS)


def gemv_triton(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    act: str | None = None,
) -> Tensor:
    """`F.linear(act(x), weight, bias)` for x [M, K] with M <= MAX_ROWS, weight [N, K], bias [N] or None -> [M, N]
    in x's dtype; fp32 accumulation, so the values agree with cuBLAS's within one rounding of the result.
    `act`: None; "relu2", relu(x)²; "silu_mul", silu(x[:, :K]) · x[:, K:2K] for x [M, >= 2K] (a fused gate/up
    GEMM's output), each with the values `activation_triton`'s kernel would have stored, so the result is the
    gemv of that tensor. `block_n`, `block_k` (powers of two), `num_warps`, `num_stages`: the tiling (defaults
    BLOCK_N (`_block_n`), BLOCK_K, NUM_WARPS, Triton's stages), which changes the result only within rounding."""
    if act not in _ACT:
        raise ValueError(f"act {act!r}: one of {sorted(a for a in _ACT if a)} or None")
    gated = act == "silu_mul"
    if x.dim() != 2 or weight.dim() != 2 or not (x.shape[1] >= 2 * weight.shape[1] if gated
                                                 else x.shape[1] == weight.shape[1]):
        need = "[M, >= 2K]" if gated else "[M, K]"
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: need {need} and [N, K]")
    M, K = x.shape[0], weight.shape[1]
    N = weight.shape[0]
    if M > MAX_ROWS:
        raise ValueError(f"gemv_triton takes at most {MAX_ROWS} rows, got {M}")
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias {tuple(bias.shape)}: need [{N}]")
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.copy_(bias.expand(M, N) if bias is not None else torch.zeros_like(y))
    x = x if x.stride(1) == 1 else x.contiguous()
    weight = weight if weight.stride(1) == 1 else weight.contiguous()
    bn = _block_n(x, N, block_n)
    bk = min(block_k or BLOCK_K, max(16, triton.next_power_of_2(K)))
    _gemv_kernel[(triton.cdiv(N, bn),)](
        x, weight, weight if bias is None else bias, y, M, N, K, x.stride(0), weight.stride(0), y.stride(0),
        ROWS=triton.next_power_of_2(M), BLOCK_N=bn, BLOCK_K=bk, HAS_BIAS=bias is not None, ACT=_ACT[act],
        num_warps=num_warps or NUM_WARPS, **({"num_stages": num_stages} if num_stages else {}), **pdl_launch(x),
    )
    return y


@triton.jit
def _norm_gemv_kernel(
    x_ptr, d_ptr, nw_ptr, w_ptr, b_ptr, y_ptr, s_ptr, N, K, eps, s_wn,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_DELTA: tl.constexpr, ZERO_CENTRED: tl.constexpr,
    HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
):
    """One row: the stream s = x + delta [K] (rounded to x's dtype, as `x + delta` is; x where not HAS_DELTA),
    y = W·(s ⊙ nw)·rstd (+ b) with rstd = 1 / rms(s): the norm's scale applied after the sum, so one pass over
    the weight also gathers Σs². Program 0 stores s where HAS_DELTA."""
    pdl_entry(PDL)
    X: tl.constexpr = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    nn = pid.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = nn < N
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    squares = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        w = tl.load(w_ptr + nn[:, None] * s_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        # s twice: as [BLOCK_K] for Σs² and the stream, and in the weight block's layout for the product (see
        # `_x_row`), each computed from its own loads (L1 hits) rather than converted between layouts
        s1 = _stream(x_ptr, d_ptr, kk, k_ok, X, HAS_DELTA)
        squares += s1 * s1
        if HAS_DELTA:
            tl.store(s_ptr + kk, s1.to(X), mask=k_ok & (pid == 0))
        at = kk[None, :] + 0 * nn[:, None]
        scale = _norm_weight(nw_ptr, at, k_ok[None, :], ZERO_CENTRED)
        acc += w.to(tl.float32) * (_stream(x_ptr, d_ptr, at, k_ok[None, :], X, HAS_DELTA) * scale)
    rstd = tl.rsqrt(tl.math.div_rn(tl.sum(squares, 0), K * 1.0) + eps)  # mean(s²), as the norm kernel's
    y = tl.sum(acc, 1) * rstd
    if HAS_BIAS:
        y += tl.load(b_ptr + nn, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + nn, y.to(y_ptr.dtype.element_ty), mask=n_ok)


def add_rms_norm_gemv_triton(
    x: Tensor,
    delta: Tensor | None,
    norm_weight: Tensor,
    eps: float,
    zero_centred: bool,
    weight: Tensor,
    bias: Tensor | None = None,
    block_k: int | None = None,
) -> tuple[Tensor, Tensor]:
    """A pre-norm layer's residual add, RMSNorm and first GEMM for one row, in one launch: x, delta [1, K] (delta
    None: no add), norm_weight [K] (used as 1 + w where `zero_centred`), weight [N, K], bias [N] or None ->
    (y [1, N], stream [1, K]): stream = x + delta in x's dtype (x itself without delta) and y =
    `F.linear(RMSNorm(stream), weight, bias)`, fp32 throughout: the normalised row is not rounded to x's dtype
    before the product, as the two-launch path rounds it, so y agrees with it within a rounding of y.
    `block_k` (a power of two, default NORM_BLOCK_K): the step over K, BLOCK_N outputs a program."""
    if x.dim() != 2 or x.shape[0] != 1 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: need [1, K] and [N, K]")
    K, N = x.shape[1], weight.shape[0]
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype):
        raise ValueError(f"delta {tuple(delta.shape)} {delta.dtype}: need {tuple(x.shape)} {x.dtype}")
    if norm_weight.shape != (K,):
        raise ValueError(f"norm weight {tuple(norm_weight.shape)}: need [{K}]")
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias {tuple(bias.shape)}: need [{N}]")
    if K == 0:
        raise ValueError("RMSNorm of an empty row")
    y = torch.empty(1, N, dtype=x.dtype, device=x.device)
    stream = x if delta is None else torch.empty_like(x, memory_format=torch.contiguous_format)
    if N == 0 and delta is None:
        return y, stream
    x, weight = x.contiguous(), weight if weight.stride(1) == 1 else weight.contiguous()
    bk = min(block_k or NORM_BLOCK_K, max(16, triton.next_power_of_2(K)))
    bn = _block_n(x, N, None)
    _norm_gemv_kernel[(max(1, triton.cdiv(N, bn)),)](
        x, x if delta is None else delta.contiguous(), norm_weight.contiguous(), weight,
        weight if bias is None else bias, y, stream, N, K, eps, weight.stride(0),
        BLOCK_N=bn, BLOCK_K=bk, HAS_DELTA=delta is not None, ZERO_CENTRED=zero_centred,
        HAS_BIAS=bias is not None, num_warps=NUM_WARPS, **pdl_launch(x),
    )
    return y, stream


@triton.jit
def _gated_norm_gemv_kernel(
    y_ptr, z_ptr, nw_ptr, w_ptr, b_ptr, out_ptr, N, G, eps, s_yg, s_zg, s_wn,
    GS: tl.constexpr, GPS: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, MID: tl.constexpr,
    O: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
):
    """One row: y, z [G, GS] by their group strides (unit last); the gated norm of MODE (`rms_norm_triton`'s
    GROUP, SILU, SIGMOID) over each group of GS channels, rounded to O as its launch stores it, then W·that
    (+ b) for W [N, G·GS]. GPS groups a step, each group's Σh² in the step that reads it, all in the weight
    block's [BLOCK_N, GPS, GS] layout (see `_x_row`)."""
    pdl_entry(PDL)
    X: tl.constexpr = y_ptr.dtype.element_ty
    nn = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = nn < N
    c = tl.arange(0, GS)[None, None, :]
    lead = 0 * nn[:, None, None]
    acc = tl.zeros([BLOCK_N, GPS, GS], dtype=tl.float32)
    for g0 in range(0, G, GPS):
        g = (g0 + tl.arange(0, GPS)).to(tl.int64)[None, :, None]
        g_ok = g < G
        z = tl.load(z_ptr + g * s_zg + c + lead, mask=g_ok, other=0.0).to(tl.float32)
        h = _norm_input(tl.load(y_ptr + g * s_yg + c + lead, mask=g_ok, other=0.0).to(tl.float32), z, MODE)
        rstd = tl.rsqrt(tl.math.div_rn(tl.sum(h * h, 2), GS * 1.0) + eps)  # each group's mean(h²)
        if MODE == GROUP:  # this group's slice of the weight; the others share one [GS]
            wn = tl.load(nw_ptr + g * GS + c + lead, mask=g_ok, other=0.0).to(tl.float32)
        else:
            wn = tl.load(nw_ptr + 0 * g + c + lead, mask=g_ok, other=0.0).to(tl.float32)
        normed = _norm_output(h * rstd[:, :, None], z, wn, MODE, False, X, MID, O)
        w = tl.load(w_ptr + nn[:, None, None] * s_wn + g * GS + c, mask=n_ok[:, None, None] & g_ok, other=0.0)
        acc += w.to(tl.float32) * normed
    y = tl.sum(tl.sum(acc, 2), 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + nn, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + nn, y.to(out_ptr.dtype.element_ty), mask=n_ok)


_GATED_MODES = {"group": GROUP, "silu": SILU, "sigmoid": SIGMOID}


def gated_norm_gemv_triton(
    y: Tensor,
    z: Tensor,
    norm_weight: Tensor,
    eps: float,
    mode: str,
    weight: Tensor,
    bias: Tensor | None = None,
) -> Tensor:
    """A mixer's gated RMSNorm and the projection after it for one row, in one launch: y, z [1, G, GS] (unit last
    stride, any group stride; GS a power of two), mode "group" (`GatedGroupRMSNorm`: norm_weight [G·GS]),
    "silu" (`GatedRMSNorm`) or "sigmoid" (`SigmoidGatedRMSNorm`: norm_weight [GS] each), weight [N, G·GS], bias
    [N] or None -> `F.linear(norm(y, z).reshape(1, -1), weight, bias)` [1, N] in the norm's output dtype. The
    normalised row takes the norm kernel's roundings; the product sums in fp32 in another order than the gemv's,
    so the result agrees with the two launches within a rounding of it."""
    if mode not in _GATED_MODES:
        raise ValueError(f"mode {mode!r}: one of {sorted(_GATED_MODES)}")
    if y.dim() != 3 or y.shape[0] != 1 or z.shape != y.shape or y.stride(2) != 1 or z.stride(2) != 1:
        raise ValueError(f"y {tuple(y.shape)}, z {tuple(z.shape)}: need one [1, G, GS] each, unit last stride")
    G, GS = y.shape[1], y.shape[2]
    if GS & (GS - 1) or GS == 0:
        raise ValueError(f"groups of {GS} channels: need a power of two")
    if norm_weight.shape != ((G * GS,) if mode == "group" else (GS,)):
        raise ValueError(f"norm weight {tuple(norm_weight.shape)} for mode {mode!r} and y {tuple(y.shape)}")
    if weight.dim() != 2 or weight.shape[1] != G * GS:
        raise ValueError(f"weight {tuple(weight.shape)}: need [N, {G * GS}]")
    N = weight.shape[0]
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias {tuple(bias.shape)}: need [{N}]")
    mid = torch.promote_types(norm_weight.dtype, y.dtype)
    out_dtype = mid if mode == "group" else y.dtype
    out = torch.empty(1, N, dtype=out_dtype, device=y.device)
    if N == 0:
        return out
    weight = weight if weight.stride(1) == 1 else weight.contiguous()
    bn = _block_n(y, N, None)
    _gated_norm_gemv_kernel[(triton.cdiv(N, bn),)](
        y, z, norm_weight.contiguous(), weight, weight if bias is None else bias, out, N, G, eps, y.stride(1),
        z.stride(1), weight.stride(0), GS=GS, GPS=max(1, NORM_BLOCK_K // GS), BLOCK_N=bn,
        MODE=_GATED_MODES[mode], MID=_TL_DTYPE[mid], O=_TL_DTYPE[out_dtype], HAS_BIAS=bias is not None,
        num_warps=NUM_WARPS, **pdl_launch(y),
    )
    return out
