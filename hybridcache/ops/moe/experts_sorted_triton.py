"""Routed experts for mid-size token counts (decode batches, verify steps): pairs sorted by expert, each
program a block of one expert's pairs against a tile of its weight rows (tl.dot), so each expert's weights
are read once per block of up to BLOCK_M pairs instead of once per pair. No host sync (graph capturable).

With x [N, D], index / weight [N, k], P = N·k pairs p = n·k + j, `order` [P] the pairs sorted by expert and
`ends` [E] the end of each expert's run in it (`sort_pairs_triton`, or torch's `sort.sort_by_expert`):

  sort        `sort_pairs_triton` (one program, up to MAX_SORT_PAIRS pairs): order and ends in one launch
  blocks      expert e owns ⌈count_e / BLOCK_M⌉ blocks of consecutive pairs of its run (BLOCK_M: `block_m`,
              the mean pairs an expert with headroom); grid axis 0 has ⌈P / BLOCK_M⌉ + E programs (at least
              as many as there are blocks), each finds its (expert, block) from `ends`, the surplus return
              at once
  kernel 1    h[p] = rnd_W(rnd_W(act(rnd_W(gate[e] · x[n]))) · rnd_W(up[e] · x[n]))   (non-gated: rnd_W(act(·)))
  kernel 2    y[p] = rnd_O(rnd_M(rnd_O(rnd_W(down[e] · h[p])) · weight[p]))
  kernel 3    out[n] = the k pairs' y summed in k order, rounding to O after each add

A shared expert of M parts (`experts_triton`'s layout) is experts E .. E + M - 1 of the sort, one pair a
token each; kernel 1 takes each part as an expert of I rows (part 0's first column tile also the gate
logit). Its down product runs over all S = M·I (h's M rows of a token are one row of S): in kernel 2 part
s's blocks take columns s·I .. s·I + I of it, into an fp32 partial of the token (no rounding), so the
shared expert's blocks loop over I like a routed expert's, not over M·I; kernel 3 sums a token's M
partials in part order, rounds to W (then O) as the GEMM's output, scales by 1 or rnd_W(sigmoid(logit))
and adds the result after the routed ones.

the roundings of `experts_triton` (and so of `models/layers/experts.py`'s paths): see its docstring. The
dot products accumulate in fp32 (fp32 operands as IEEE products, not TF32), in another order than torch's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..pdl_triton import pdl_entry, pdl_launch
from ..rms_norm_triton import _TL_DTYPE, _round, _sigmoid
from ..triton_dot import dot, dot_args
from ..triton_support import num_sms
from . import SharedExpert
from .experts_triton import _ACT, _check, activation, shared_args

MIN_BLOCK_M, MAX_BLOCK_M = 16, 64  # pairs a program: tl.dot's smallest M on the GPU, and the most `_tiles` takes
BLOCK_N = 64  # output columns a program (CUDA), or half as many
BLOCK_K = 128  # inner elements a loop step (CUDA)
MAX_SORT_PAIRS = 4096  # pairs the one-program sort kernel holds


@triton.jit
def _expert_block(ends_ptr, E, BLOCK_M: tl.constexpr, E_POW2: tl.constexpr):
    """(e, first, stop) of this program's block: its expert (E for a surplus program) and the block's rows
    [first, stop) of `order`. Experts' blocks are numbered in expert order."""
    ids = tl.arange(0, E_POW2)
    real = ids < E
    ends = tl.load(ends_ptr + ids, mask=real, other=0)
    begins = tl.load(ends_ptr + ids - 1, mask=real & (ids > 0), other=0)
    blocks = tl.where(real, (ends - begins + BLOCK_M - 1) // BLOCK_M, 0)
    last = tl.cumsum(blocks, 0)  # inclusive: the blocks of experts 0..e
    pid = tl.program_id(0)
    e = tl.sum((last <= pid).to(tl.int32), 0)  # the first expert whose blocks reach past pid
    mine = ids == e
    first = tl.sum(tl.where(mine, begins + (pid - (last - blocks)) * BLOCK_M, 0), 0)
    stop = tl.minimum(tl.sum(tl.where(mine, ends, 0), 0), first + BLOCK_M)
    return e, first, stop


@triton.jit
def _block(ends_ptr, order_ptr, E, ROWS, E_POW2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's block and output tile: (e: E for a surplus program, E counting the shared expert's
    parts; live [BLOCK_M]; pair [BLOCK_M] int64; cols, col_ok [BLOCK_N] of ROWS output rows)."""
    e, first, stop = _expert_block(ends_ptr, E, BLOCK_M, E_POW2)
    r = first + tl.arange(0, BLOCK_M)
    live = r < stop  # none for a surplus program
    pair = tl.load(order_ptr + r, mask=live, other=0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return e, live, pair, cols, cols < ROWS


@triton.jit
def _sort_pairs_kernel(index_ptr, order_ptr, ends_ptr, P, E, K: tl.constexpr, M: tl.constexpr,
                       P_POW2: tl.constexpr, E_POW2: tl.constexpr, PDL: tl.constexpr):
    """One program: the P pairs sorted by (expert, pair) as one key, and each expert's run end. With M shared
    parts, pair K + s of each token (p % (K + M) == K + s) is expert E + s's, after the routed ones."""
    pdl_entry(PDL)
    p = tl.arange(0, P_POW2)
    live = p < P
    KP: tl.constexpr = K + M
    n, j = p // KP, p % KP
    ids = tl.load(index_ptr + n * K + j, mask=live & (j < K), other=0).to(tl.int32)
    ids = tl.where(j < K, ids, E + j - K)
    ids = tl.where(live, ids, E + M)  # padding sorts after every expert
    order = tl.sort(ids * P_POW2 + p) % P_POW2
    tl.store(order_ptr + p, order, mask=live)
    ends = tl.cumsum(tl.histogram(ids, E_POW2, mask=live), 0)
    e = tl.arange(0, E_POW2)
    tl.store(ends_ptr + e, ends, mask=e < E + M)


@triton.jit
def _sorted_up_kernel(x_ptr, order_ptr, ends_ptr, gate_ptr, up_ptr, shared_gate_ptr, shared_up_ptr, logit_w_ptr,
                      h_ptr, logit_ptr, E, stride_xn, stride_we, stride_wi, stride_si, K: tl.constexpr,
                      I: tl.constexpr, D: tl.constexpr, ACT: tl.constexpr, GATED: tl.constexpr, M: tl.constexpr,
                      LOGIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, E_POW2: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    e, live, pair, cols, col_ok = _block(ends_ptr, order_ptr, E + M, I, E_POW2, BLOCK_M, BLOCK_N)
    if e >= E + M:
        return
    shared = e >= E  # shared part e - E: the shared expert's rows (e - E)·I + cols
    if shared:
        first = (e - E).to(tl.int64) * I * stride_si
        up_ptr, gate_ptr = shared_up_ptr + first, shared_gate_ptr + first
    else:
        first = e.to(tl.int64) * stride_we
        up_ptr, gate_ptr = up_ptr + first, gate_ptr + first
    w = cols.to(tl.int64)[None, :] * tl.where(shared, stride_si, stride_wi)
    token = pair // (K + M)
    logit_ok = live & (e == E) & (tl.program_id(1) == 0)  # the logit once a token (LOGIT)
    acc_u = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    acc_g = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    acc_l = tl.full([BLOCK_M, BLOCK_K], 0.0, tl.float32)
    for k0 in range(0, D, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < D
        xv = tl.load(x_ptr + token[:, None] * stride_xn + k[None, :], mask=live[:, None] & k_ok[None, :], other=0.0)
        if LOGIT:
            acc_l += tl.load(logit_w_ptr + k[None, :] + 0 * token[:, None], mask=logit_ok[:, None] & k_ok[None, :],
                             other=0.0).to(tl.float32) * xv.to(tl.float32)
        w_ok = k_ok[:, None] & col_ok[None, :]
        acc_u = dot(xv, tl.load(up_ptr + w + k[:, None], mask=w_ok, other=0.0), acc_u, PRECISION, UPCAST)
        if GATED:
            acc_g = dot(xv, tl.load(gate_ptr + w + k[:, None], mask=w_ok, other=0.0), acc_g, PRECISION, UPCAST)
    W: tl.constexpr = up_ptr.dtype.element_ty
    if LOGIT:  # in W, as the shared expert's GEMM stores its extra row
        tl.store(logit_ptr + token, _round(tl.sum(acc_l, 1), W), mask=logit_ok)
    v = _round(acc_g if GATED else acc_u, W)
    v = activation(v, ACT)
    v = _round(v, W)
    if GATED:
        v = _round(v * _round(acc_u, W), W)
    tl.store(h_ptr + pair[:, None] * I + cols[None, :], v.to(W), mask=live[:, None] & col_ok[None, :])


@triton.jit
def _sorted_down_kernel(h_ptr, order_ptr, ends_ptr, weight_ptr, down_ptr, shared_down_ptr, y_ptr, part_ptr, E,
                        stride_we, stride_wd, stride_sd, K: tl.constexpr, I: tl.constexpr, D: tl.constexpr,
                        M: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, E_POW2: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    e, live, pair, cols, col_ok = _block(ends_ptr, order_ptr, E + M, D, E_POW2, BLOCK_M, BLOCK_N)
    if e >= E + M:  # surplus
        return
    shared = e >= E  # shared part e - E: the shared expert's down over its columns (e - E)·I .. + I
    if shared:
        down_ptr = shared_down_ptr + (e - E).to(tl.int64) * I
    else:
        down_ptr = down_ptr + e.to(tl.int64) * stride_we
    w = cols.to(tl.int64)[None, :] * tl.where(shared, stride_sd, stride_wd)
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    for k0 in range(0, I, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < I
        hv = tl.load(h_ptr + pair[:, None] * I + k[None, :], mask=live[:, None] & k_ok[None, :], other=0.0)
        acc = dot(hv, tl.load(down_ptr + w + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0), acc,
                   PRECISION, UPCAST)
    out_ok = live[:, None] & col_ok[None, :]
    KP: tl.constexpr = K + M
    if shared:  # token n's partial of part s at row n·M + s, unrounded: kernel 3 sums, rounds and scales
        partial = pair // KP * M + (e - E)
        tl.store(part_ptr + partial[:, None] * D + cols[None, :], acc, mask=out_ok)
        return
    W: tl.constexpr = down_ptr.dtype.element_ty
    O: tl.constexpr = y_ptr.dtype.element_ty
    y = _round(acc, W)
    if O != W:
        y = _round(y, O)
    # promote(O, weight's dtype) is O or fp32: the product rounds to O once
    weight = tl.load(weight_ptr + pair // KP * K + pair % KP, mask=live, other=1.0).to(tl.float32)
    y = _round(y * weight[:, None], O)
    tl.store(y_ptr + pair[:, None] * D + cols[None, :], y.to(O), mask=out_ok)


@triton.jit
def _sorted_sum_kernel(y_ptr, part_ptr, logit_ptr, out_ptr, D: tl.constexpr, K: tl.constexpr, M: tl.constexpr,
                       LOGIT: tl.constexpr, W: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out[n] = y's rows n·(K + M) + j for j < K (the routed pairs), then the shared expert's M partials of
    token n summed, in W as its GEMM's output, scaled by 1 or sigmoid(logit[n]) in W, added in O."""
    pdl_entry(PDL)
    n = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < D
    O: tl.constexpr = out_ptr.dtype.element_ty
    total = tl.full([BLOCK], 0.0, tl.float32)
    for j in tl.static_range(K):
        total = _round(total + tl.load(y_ptr + (n * (K + M) + j) * D + cols, mask=ok, other=0.0).to(tl.float32), O)
    if M > 0:
        acc = tl.full([BLOCK], 0.0, tl.float32)
        for s in tl.static_range(M):
            acc += tl.load(part_ptr + (n * M + s) * D + cols, mask=ok, other=0.0)
        y = _round(acc, W)
        if O != W:
            y = _round(y, O)
        if LOGIT:  # sigmoid(logit) in W (= O with a logit), then the product in W
            y = _round(y * _round(_sigmoid(tl.load(logit_ptr + n)), W), O)
        total = _round(total + y, O)
    tl.store(out_ptr + n * D + cols, total.to(O), mask=ok)


def sort_pairs_triton(index: Tensor, num_experts: int, shared: int = 0) -> tuple[Tensor, Tensor]:
    """`sort.sort_by_expert`'s (order, ends) in one launch, for up to MAX_SORT_PAIRS pairs: index [N, k] ->
    order [N*k] int32, ends [E] int32. `shared` (M, a shared expert's parts): each token has M more pairs,
    pair k + s expert E + s's: order [N*(k+M)], ends [E+M]."""
    (N, K) = index.shape
    P = N * (K + shared)
    assert P <= MAX_SORT_PAIRS, f"{P} pairs: the sort kernel holds at most {MAX_SORT_PAIRS}"
    order = torch.empty(P, device=index.device, dtype=torch.int32)
    ends = torch.empty(num_experts + shared, device=index.device, dtype=torch.int32)
    _sort_pairs_kernel[(1,)](index.contiguous(), order, ends, P, num_experts, K=K, M=shared,
                             P_POW2=max(2, triton.next_power_of_2(P)),
                             E_POW2=max(2, triton.next_power_of_2(num_experts + shared)), num_warps=4,
                             **pdl_launch(order))
    return order, ends


def block_m(pairs: int, experts: int) -> int:
    """Pairs a program: a power of two at least 1.5x the mean pairs an expert (MIN_BLOCK_M..MAX_BLOCK_M).
    Each block reads its expert's weights once, so an expert whose pairs spill into a second block reads
    them twice: the headroom keeps the busier experts of a random routing in one block."""
    mean = -(-3 * pairs // (2 * experts))
    return min(MAX_BLOCK_M, max(MIN_BLOCK_M, triton.next_power_of_2(mean)))


def _tiles(pairs: int, experts: int, rows: int, inner: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for an output of `rows` over `inner`: `block_m` pairs a program; CUDA:
    BLOCK_N columns a program where that still gives about 2 programs an SM over the blocks the pairs can
    fill, else half as many; BLOCK_K inner elements a step (the best of a sweep on the H200,
    benchmarks/ops_moe.py --sweep). The CPU interpreter pays per operation: every column and the whole
    inner width at once."""
    m = block_m(pairs, experts)
    if device.type != "cuda":
        return m, triton.next_power_of_2(rows), triton.next_power_of_2(inner)
    blocks = min(experts, pairs) + pairs // m
    wide = blocks * triton.cdiv(rows, BLOCK_N) >= 2 * num_sms(device)
    return m, BLOCK_N if wide else BLOCK_N // 2, min(BLOCK_K, max(16, triton.next_power_of_2(inner)))


def sorted_experts_triton(x: Tensor, index: Tensor, weight: Tensor, order: Tensor, ends: Tensor, up: Tensor,
                          down: Tensor, gate: Tensor | None, act: str, out_dtype: torch.dtype,
                          tiles: tuple[int, int, int] | None = None, shared: SharedExpert | None = None,
                          num_warps: int = 4) -> Tensor:
    """`experts_triton.fused_experts_triton`'s result (same arguments and roundings) from the pairs sorted by
    expert: `order` [N*k], `ends` [E] int32 from `sort.sort_by_expert(index, E)` (with `shared` of M parts:
    `sort_pairs_triton(index, E, shared=M)`'s [N*(k+M)], [E+M]). Three launches.
    `tiles` (tests, benchmarks): (BLOCK_M, BLOCK_N, BLOCK_K) for both GEMM kernels instead of `_tiles`';
    `num_warps` theirs (the tiling sweep, `benchmarks/ops_moe.py --sweep`)."""
    _check(x, index, weight, up, down, gate, act, out_dtype, shared)
    (N, K), (E, I, D) = index.shape, up.shape
    s = shared_args(shared, x, up, down)
    logit = int(shared is not None and shared.gate_logit is not None)
    P = N * (K + s.parts)
    assert order.shape == (P,) and ends.shape == (E + s.parts,), \
        f"order {tuple(order.shape)}, ends {tuple(ends.shape)}"
    out = torch.empty(N, D, device=x.device, dtype=out_dtype)
    if N == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    weight, order, ends = weight.contiguous(), order.contiguous(), ends.contiguous()
    dots = dot_args(x)
    e_pow2 = triton.next_power_of_2(E + s.parts)
    h = torch.empty(P, I, device=x.device, dtype=x.dtype)
    bm, block_n, block_k = tiles or _tiles(P, E + s.parts, I, D, x.device)
    _sorted_up_kernel[(triton.cdiv(P, bm) + E + s.parts, triton.cdiv(I, block_n))](
        x, order, ends, up if gate is None else gate, up, s.gate, s.up, s.logit_row, h, s.logits, E, x.stride(0),
        up.stride(0), up.stride(1), s.stride_up, K=K, I=I, D=D, ACT=_ACT[act], GATED=gate is not None, M=s.parts,
        LOGIT=logit, **dots, E_POW2=e_pow2, BLOCK_M=bm, BLOCK_N=block_n,
        BLOCK_K=block_k, num_warps=num_warps, **pdl_launch(x))
    y = torch.empty(P, D, device=x.device, dtype=out_dtype)  # the shared expert's rows unused
    part = torch.empty(N * s.parts, D, device=x.device, dtype=torch.float32) if s.parts else y
    bm, block_n, block_k = tiles or _tiles(P, E + s.parts, D, I, x.device)
    _sorted_down_kernel[(triton.cdiv(P, bm) + E + s.parts, triton.cdiv(D, block_n))](
        h, order, ends, weight, down, s.down, y, part, E, down.stride(0), down.stride(1), s.stride_down,
        K=K, I=I, D=D, M=s.parts, **dots, E_POW2=e_pow2, BLOCK_M=bm,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, **pdl_launch(h))
    block = min(1024, triton.next_power_of_2(D))
    _sorted_sum_kernel[(N, triton.cdiv(D, block))](y, part, s.logits, out, D=D, K=K, M=s.parts, LOGIT=logit,
                                                  W=_TL_DTYPE[x.dtype], BLOCK=block, num_warps=4, **pdl_launch(y))
    return out
