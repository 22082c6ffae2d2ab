"""The routers' selection as one Triton launch each: one program a token, the token's E logits in
registers; no host sync. From the logits (the router GEMM a torch `F.linear`), or, given the router weight,
from x itself: the program computes its token's logits x·Wᵀ in fp32 (x cast to fp32, as the routers do),
for decode and verify batches, where the GEMM (and TopKRouter's cast of x) would be launches of their own.
Every program then reads all of W, so `fuses_logits` admits that only up to `FUSED_MAX_MACS` (N·E·D).

softmax_topk_triton   p = softmax(logits) in fp32; the k largest p; weights p (/ their sum when `renormalise`),
                      cast to the logits' dtype                                   (`SoftmaxTopKRouter`)
group_topk_triton     s = sigmoid(logits), c = s + bias; the experts in `n_group` groups of E / n_group,
                      a group scored by the sum of its two largest c; the `topk_group` best groups kept,
                      the k largest c among their experts; weights s of those (/ (their sum + 1e-20) when
                      `renormalise`) times `scaling`, fp32                          (`TopKRouter`)

Ties: every selection takes the lowest index among equal values (torch.topk's order on the CPU, on every
selection here: experts, a group's best two, groups). The top k come out in descending value order, as
torch.topk's `sorted=True` gives them. Against torch in fp32, exp and the divisions differ by an ulp or so,
so a choice can differ from torch's only between values that close (random logits never are). The
in-kernel logits sum the products in another order than cuBLAS: an ulp or so too.

With the logits from x, a pre-norm block's residual add and RMSNorm can run in the same launch
(`add_rms_norm_softmax_topk_triton`, `add_rms_norm_group_topk_triton`; `AddNorm`): the program forms its token's
stream s = x + d and h = RMSNorm(s) as `rms_norm_triton.add_rms_norm_triton` does (its roundings; the sum of
squares in the kernel's own order, so h can land an ulp away), stores both for the experts, and takes the logits
of h as it stands in registers, as the two launches would from the stored h. One launch and one wait fewer a
mixture; nothing is recomputed, since a program takes one token's whole row either way.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..pdl_triton import pdl_entry, pdl_launch
from ..rms_norm_triton import _round
from . import ROUTER_MAX_EXPERTS


# tl.reduce with these is tl.max / tl.min / tl.sum on fp32 and int32 without a nested jit call (each costs the
# interpreter ~1 ms): the kernels below call only builtins (tl.full, not tl.zeros) and inline their selection
_MAX, _MIN, _SUM = tl.standard._elementwise_max, tl.standard._elementwise_min, tl.standard._sum_combine

FUSED_MAX_MACS = 2 ** 22  # N·E·D up to which the kernels compute the logits (E 8 x D 2048: 256 tokens)
LOGIT_TILE = 4096  # experts x hidden columns of W a program of several tokens (the interpreter's) holds per step
# on CUDA, where a program takes one token: as much of W per step as 8 warps hold without spilling (E 8 x D
# 2048 in one step: 112 registers a thread compiled for sm_90), so its loads are in flight together instead of
# one round trip per LOGIT_TILE
ONE_TOKEN_TILE = 16384
# Where W fits one step (BLOCK_D >= D, every decode launch on CUDA) the program loads it before its PDL wait: W is
# a parameter no kernel of the step writes, so its round trip overlaps the launches before it; the products are
# the same, in the same order. H100, qwen3_next's batch-1 graph step (gemv_steps.sh, session 51, one call): the
# router's GPU time 0.072 ms a step against 0.083 without (its 12 launches, PDL waits included), 1,128 tok/s
# against 1,121 with the down kernel's X_IN_TILE off as well.
WEIGHTS_BEFORE_WAIT = True
# (Fewer warps for a one-token program, its W step scaled with them, so that each reduction of the selection
# crosses fewer warps, were no faster than the 8 it takes above LOGIT_TILE of W: H100, us a call at batch 1 at
# 1 / 2 / 4 warps, kimi_linear 8.4 / 6.6 / 5.7, qwen3_next 7.5 / 5.8 / 4.1; the 8-warp launch, timed twice in
# the same run, 5.7 and 7.0, 4.9 and 3.8.)


@triton.jit
def _w_step(w_ptr, D, expert, real, d):
    """W[expert] at columns d in fp32: [FLAT, BLOCK_D], 0 where not `real` or past D."""
    return tl.load(w_ptr + expert.to(tl.int64)[:, None] * D + d[None, :],
                   mask=real[:, None] & (d < D)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _weights_first(w_ptr, D, expert, real, FLAT: tl.constexpr, BLOCK_D: tl.constexpr, W_FIRST: tl.constexpr):
    """W's one step [FLAT, BLOCK_D] where W_FIRST (`_w_step` at columns 0..BLOCK_D), else zeros (unused)."""
    if W_FIRST:
        w = _w_step(w_ptr, D, expert, real, tl.arange(0, BLOCK_D))
    else:
        w = tl.full([FLAT, BLOCK_D], 0.0, tl.float32)
    return w


@triton.jit
def _logits(x_ptr, w_ptr, n, N, D, stride_xn, expert, real, w_first,
            ROWS: tl.constexpr, BLOCK_D: tl.constexpr, FLAT: tl.constexpr, W_FIRST: tl.constexpr):
    """fp32 x[n] · W[expert]ᵀ: [ROWS, FLAT], 0 where not `real` (expert [FLAT] indexes W's rows); W_FIRST: W
    is `w_first` [FLAT, BLOCK_D] (one step covers D), loaded by the caller."""
    acc = tl.full([ROWS, FLAT], 0.0, tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        xs = tl.load(x_ptr + n.to(tl.int64)[:, None] * stride_xn + d[None, :],
                     mask=(n < N)[:, None] & (d < D)[None, :], other=0.0).to(tl.float32)  # [ROWS, BLOCK_D]
        ws = w_first if W_FIRST else _w_step(w_ptr, D, expert, real, d)
        acc += tl.reduce(xs[:, None, :] * ws[None, :, :], 2, _SUM)
    return acc


@triton.jit
def _stream(x_ptr, d_ptr, at, ok, X: tl.constexpr):
    """x + d at offsets `at` in fp32, rounded to X as torch's add in x's dtype; zeros where not ok."""
    s = tl.load(x_ptr + at, mask=ok, other=0.0).to(tl.float32)
    return _round(s + tl.load(d_ptr + at, mask=ok, other=0.0).to(tl.float32), X)


@triton.jit
def _normed_logits(x_ptr, d_ptr, nw_ptr, h_ptr, s_ptr, w_ptr, eps, n, N, D, stride_xn, expert, real, w_first,
                   ZERO_CENTRED: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, FLAT: tl.constexpr,
                   W_FIRST: tl.constexpr):
    """`_logits` of h = RMSNorm(s), s = x + d (norm weight nw_ptr, `eps`), x and d rows of stride_xn: a first
    pass sums s², a second forms s again (L1 hits), stores s and h [N, D] contiguous in x's dtype (s_ptr,
    h_ptr) and multiplies h, rounded as stored, into W (`w_first` where W_FIRST, as `_logits`). -> [ROWS, FLAT]
    fp32.

    Loading W with x and d where the row fits one step (one memory round trip fewer; session 47, history 7b9c124)
    summed the logits in another order on an H100: the weights then differed in the last bit from the router run on
    the stored h (4 router-norm tests failed), so it was taken back, though kimi_linear's batch-1 step replayed in
    0.592 ms with it against 0.598 without (two calls on one H100, not back to back)."""
    X: tl.constexpr = x_ptr.dtype.element_ty
    squares = tl.full([ROWS], 0.0, tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        ok = (n < N)[:, None] & (d < D)[None, :]
        s = _stream(x_ptr, d_ptr, n.to(tl.int64)[:, None] * stride_xn + d[None, :], ok, X)
        squares += tl.reduce(s * s, 1, _SUM)
    rstd = tl.rsqrt(tl.math.div_rn(squares, D * 1.0) + eps)  # as the norm kernel: mean(s²), then rsqrt
    acc = tl.full([ROWS, FLAT], 0.0, tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        ok = (n < N)[:, None] & (d < D)[None, :]
        s = _stream(x_ptr, d_ptr, n.to(tl.int64)[:, None] * stride_xn + d[None, :], ok, X)
        nw = tl.load(nw_ptr + d, mask=d < D, other=0.0).to(tl.float32)
        if ZERO_CENTRED:
            nw = 1.0 + nw
        h = _round(s * rstd[:, None] * nw[None, :], X)
        out = n.to(tl.int64)[:, None] * D + d[None, :]
        tl.store(s_ptr + out, s.to(X), mask=ok)
        tl.store(h_ptr + out, h.to(X), mask=ok)
        ws = w_first if W_FIRST else _w_step(w_ptr, D, expert, real, d)
        acc += tl.reduce(h[:, None, :] * ws[None, :, :], 2, _SUM)
    return acc


@triton.jit
def _softmax_topk_kernel(logits_ptr, w_ptr, index_ptr, weight_ptr, N, D, stride_n,
                         d_ptr, nw_ptr, h_ptr, s_ptr, eps,
                         E: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr, FROM_X: tl.constexpr,
                         ADD_NORM: tl.constexpr, ZERO_CENTRED: tl.constexpr,
                         ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                         W_FIRST: tl.constexpr, PDL: tl.constexpr):
    """ADD_NORM (with FROM_X): the rows are RMSNorm(x + d) (`_normed_logits`), stored with the stream. W_FIRST
    (with FROM_X, BLOCK_D >= D): W is loaded before the PDL wait."""
    experts = tl.arange(0, BLOCK_E)
    w_first = _weights_first(w_ptr, D, experts, experts < E, BLOCK_E, BLOCK_D, W_FIRST)
    pdl_entry(PDL)
    n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_E)[None, :]
    valid = (n < N)[:, None] & (c < E)
    if FROM_X:  # logits_ptr is x; the logits rounded to x's dtype, as F.linear's output is
        if ADD_NORM:
            logit = _normed_logits(logits_ptr, d_ptr, nw_ptr, h_ptr, s_ptr, w_ptr, eps, n, N, D, stride_n, experts,
                                   experts < E, w_first, ZERO_CENTRED, ROWS, BLOCK_D, BLOCK_E, W_FIRST)
        else:
            logit = _logits(logits_ptr, w_ptr, n, N, D, stride_n, experts, experts < E, w_first, ROWS, BLOCK_D,
                            BLOCK_E, W_FIRST)
        X: tl.constexpr = logits_ptr.dtype.element_ty
        logit = _round(logit, X)
    else:
        logit = tl.load(logits_ptr + n.to(tl.int64)[:, None] * stride_n + c, mask=valid, other=float("-inf"))
    logit = tl.where(valid, logit.to(tl.float32), 0.0)  # rows past N: zeros, never stored
    ex = tl.where(valid, tl.exp(logit - tl.reduce(logit, 1, _MAX)[:, None]), 0.0)
    probs = tl.math.div_rn(ex, tl.maximum(tl.reduce(ex, 1, _SUM), 1.0)[:, None])  # a real row sums to >= 1
    kk = tl.arange(0, BLOCK_K)[None, :]
    done = (n < N)[:, None] & (kk < K)
    left = valid
    chosen = tl.full([ROWS, BLOCK_K], 0, tl.int32)
    weights = tl.full([ROWS, BLOCK_K], 0.0, tl.float32)
    for j in tl.static_range(K):  # the largest probability left, the lowest index among equal ones
        best = tl.reduce(tl.where(left, probs, float("-inf")), 1, _MAX)
        at = tl.reduce(tl.where(left & (probs == best[:, None]), c, BLOCK_E), 1, _MIN)
        left = left & (c != at[:, None])
        chosen = tl.where(kk == j, at[:, None], chosen)
        weights = tl.where((kk == j) & done, best[:, None], weights)  # rows past N keep 0 (no 0 / 0 below)
    if NORM:
        weights = tl.math.div_rn(weights, tl.maximum(tl.reduce(weights, 1, _SUM), 1e-30)[:, None])
    O: tl.constexpr = weight_ptr.dtype.element_ty
    if O != tl.float32:
        weights = _round(weights, O)
    out = n.to(tl.int64)[:, None] * K + kk
    tl.store(index_ptr + out, chosen.to(tl.int64), mask=done)
    tl.store(weight_ptr + out, weights.to(O), mask=done)


@triton.jit
def _group_topk_kernel(logits_ptr, w_ptr, bias_ptr, index_ptr, weight_ptr, N, D, stride_n, scaling,
                       d_ptr, nw_ptr, h_ptr, s_ptr, eps,
                       G: tl.constexpr, EG: tl.constexpr, TOPG: tl.constexpr, K: tl.constexpr,
                       NORM: tl.constexpr, FROM_X: tl.constexpr, ADD_NORM: tl.constexpr, ZERO_CENTRED: tl.constexpr,
                       ROWS: tl.constexpr, BLOCK_G: tl.constexpr,
                       BLOCK_EG: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                       W_FIRST: tl.constexpr, PDL: tl.constexpr):
    """ADD_NORM, W_FIRST: as `_softmax_topk_kernel`'s."""
    FLAT_E: tl.constexpr = BLOCK_G * BLOCK_EG
    f = tl.arange(0, FLAT_E)
    experts, real = (f // BLOCK_EG) * EG + f % BLOCK_EG, (f // BLOCK_EG < G) & (f % BLOCK_EG < EG)
    w_first = _weights_first(w_ptr, D, experts, real, FLAT_E, BLOCK_D, W_FIRST)
    pdl_entry(PDL)
    n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.arange(0, BLOCK_G)
    c = tl.arange(0, BLOCK_EG)
    expert3 = g[None, :, None] * EG + c[None, None, :]  # [1, BLOCK_G, BLOCK_EG]
    valid3 = (n < N)[:, None, None] & (g < G)[None, :, None] & (c < EG)[None, None, :]
    if FROM_X:  # logits_ptr is x; the logits over the padded experts flattened, then in groups
        if ADD_NORM:
            logit = _normed_logits(logits_ptr, d_ptr, nw_ptr, h_ptr, s_ptr, w_ptr, eps, n, N, D, stride_n, experts,
                                   real, w_first, ZERO_CENTRED, ROWS, BLOCK_D, FLAT_E, W_FIRST)
        else:
            logit = _logits(logits_ptr, w_ptr, n, N, D, stride_n, experts, real, w_first, ROWS, BLOCK_D, FLAT_E,
                            W_FIRST)
        logit = tl.reshape(logit, [ROWS, BLOCK_G, BLOCK_EG])
    else:
        logit = tl.load(logits_ptr + n.to(tl.int64)[:, None, None] * stride_n + expert3, mask=valid3, other=0.0)
    logit = logit.to(tl.float32)
    scores3 = tl.math.div_rn(tl.full(logit.shape, 1.0, tl.float32), 1.0 + tl.exp(-logit))  # torch's sigmoid
    choice3 = tl.where(valid3, scores3 + tl.load(bias_ptr + expert3, mask=valid3, other=0.0).to(tl.float32),
                       float("-inf"))

    # a group's score: its best choice plus its second best (the lowest-index best taken out once)
    best1 = tl.reduce(choice3, 2, _MAX)  # [ROWS, BLOCK_G]
    first = tl.reduce(tl.where(choice3 == best1[:, :, None], c[None, None, :], BLOCK_EG), 2, _MIN)
    best2 = tl.reduce(tl.where(c[None, None, :] == first[:, :, None], float("-inf"), choice3), 2, _MAX)
    group_score = best1 + best2
    real = (n < N)[:, None] & (g < G)[None, :]
    left = real
    for _ in tl.static_range(TOPG):  # the best group left, the lowest index among equal ones
        best = tl.reduce(tl.where(left, group_score, float("-inf")), 1, _MAX)
        at = tl.reduce(tl.where(left & (group_score == best[:, None]), g[None, :], BLOCK_G), 1, _MIN)
        left = left & (g[None, :] != at[:, None])
    keep3 = (real & ~left)[:, :, None]  # the groups picked

    # the k best choices in the kept groups, over the experts flattened to [ROWS, BLOCK_G * BLOCK_EG]
    FLAT: tl.constexpr = BLOCK_G * BLOCK_EG
    choice = tl.reshape(tl.where(keep3, choice3, float("-inf")), [ROWS, FLAT])
    scores = tl.reshape(scores3, [ROWS, FLAT])
    expert = tl.reshape(tl.broadcast_to(expert3, [ROWS, BLOCK_G, BLOCK_EG]), [ROWS, FLAT])
    left = tl.reshape(valid3, [ROWS, FLAT])
    kk = tl.arange(0, BLOCK_K)[None, :]
    chosen = tl.full([ROWS, BLOCK_K], 0, tl.int32)
    weights = tl.full([ROWS, BLOCK_K], 0.0, tl.float32)
    for j in tl.static_range(K):  # the best choice left (-inf ones after every finite one), the lowest index first
        best = tl.reduce(tl.where(left, choice, float("-inf")), 1, _MAX)
        at = tl.reduce(tl.where(left & (choice == best[:, None]), expert, G * EG), 1, _MIN)
        hit = expert == at[:, None]
        left = left & ~hit
        chosen = tl.where(kk == j, at[:, None], chosen)
        weights = tl.where(kk == j, tl.reduce(tl.where(hit, scores, 0.0), 1, _SUM)[:, None], weights)
    if NORM:
        weights = tl.math.div_rn(weights, tl.reduce(weights, 1, _SUM)[:, None] + 1e-20)
    out = n.to(tl.int64)[:, None] * K + kk
    done = (n < N)[:, None] & (kk < K)
    tl.store(index_ptr + out, chosen.to(tl.int64), mask=done)
    tl.store(weight_ptr + out, weights * scaling, mask=done)


def fuses_logits(n: int, e: int, d: int) -> bool:
    """Whether a router of `e` experts over `d` columns computes the logits of `n` tokens in its kernel."""
    return n * e * d <= FUSED_MAX_MACS


def _prepare(rows_in: Tensor, e: int, block: int, k: int, dtype: torch.dtype, weight: Tensor | None):
    """For `e` experts padded to `block`: the outputs (index [N, k] int64, weight [N, k] `dtype`) and the
    launch: input rows with a unit last stride (logits [N, E], or x [N, D] given the router `weight`
    [E, D]), W's pointer (the rows again when unused), D, ROWS, BLOCK_D, grid and num_warps. One token a
    program on CUDA (decode batches are small, every token its own SM); the interpreter, which runs programs
    one by one at a fixed cost each, takes up to 64 tokens a program."""
    N = rows_in.shape[0]
    assert 1 <= k <= e, f"top {k} of {e} experts"
    assert e <= ROUTER_MAX_EXPERTS, f"{e} experts: over the router kernels' {ROUTER_MAX_EXPERTS}"
    outputs = (torch.empty(N, k, device=rows_in.device, dtype=torch.int64),
               torch.empty(N, k, device=rows_in.device, dtype=dtype))
    rows = 1 if rows_in.is_cuda else min(64, triton.next_power_of_2(max(N, 1)))
    rows_in = rows_in if rows_in.stride(1) == 1 else rows_in.contiguous()
    if weight is None:
        launch = (rows_in, rows_in, 0, rows, 16, (triton.cdiv(N, rows),), min(8, max(1, rows * block // 256)))
    else:
        D = rows_in.shape[1]
        assert weight.shape == (e, D) and weight.is_contiguous(), f"router weight {tuple(weight.shape)}; x {N} x {D}"
        tile = ONE_TOKEN_TILE if rows == 1 else LOGIT_TILE
        block_d = max(16, min(triton.next_power_of_2(D), tile // block))
        launch = (rows_in, weight, D, rows, block_d, (triton.cdiv(N, rows),), 8 if block * block_d > LOGIT_TILE else 4)
    return outputs, launch


def _w_first(weight: Tensor | None, D: int, block_d: int) -> bool:
    """Whether a launch loads the router weight before its PDL wait (`WEIGHTS_BEFORE_WAIT`): given W, in one
    step."""
    return WEIGHTS_BEFORE_WAIT and weight is not None and block_d >= D


class AddNorm(NamedTuple):
    """A pre-norm block's residual add and RMSNorm run by a router that computes its logits: the router's rows are
    RMSNorm(x + delta), `weight` [D] (taken as 1 + w where `zero_centred`)."""

    delta: Tensor
    weight: Tensor
    eps: float
    zero_centred: bool


def _norm_args(x: Tensor, add_norm: AddNorm | None) -> tuple[tuple, dict, Tensor | None, Tensor | None]:
    """The kernels' norm arguments: (pointer args, constexprs, h, stream); h and the stream [N, D] in x's dtype,
    None without `add_norm`."""
    if add_norm is None:
        return (x, x, x, x, 0.0), dict(ADD_NORM=False, ZERO_CENTRED=False), None, None
    delta, weight = add_norm.delta, add_norm.weight
    if delta.shape != x.shape or delta.dtype != x.dtype or weight.shape != (x.shape[1],):
        raise ValueError(f"delta {tuple(delta.shape)} {delta.dtype} and norm weight {tuple(weight.shape)} against "
                         f"x {tuple(x.shape)} {x.dtype}")
    if not (x.is_contiguous() and delta.is_contiguous() and weight.is_contiguous()):
        raise ValueError("the norm run by a router reads x, delta and its weight as contiguous rows")
    h, stream = torch.empty_like(x), torch.empty_like(x)
    return ((delta, weight, h, stream, float(add_norm.eps)),
            dict(ADD_NORM=True, ZERO_CENTRED=add_norm.zero_centred), h, stream)


def _softmax_topk(logits: Tensor, k: int, renormalise: bool, weight: Tensor | None,
                  add_norm: AddNorm | None) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    E = logits.shape[1] if weight is None else weight.shape[0]
    assert weight is None or weight.dtype == logits.dtype, "SoftmaxTopKRouter's weight is in x's dtype"
    block = triton.next_power_of_2(E)
    (index, out), (rows_in, w, D, rows, block_d, grid, warps) = _prepare(logits, E, block, k, logits.dtype, weight)
    norm_ptrs, norm_flags, h, stream = _norm_args(rows_in, add_norm)
    N = logits.shape[0]
    if N:
        _softmax_topk_kernel[grid](rows_in, w, index, out, N, D, rows_in.stride(0), *norm_ptrs, E=E, K=k,
                                   NORM=renormalise, FROM_X=weight is not None, **norm_flags, ROWS=rows,
                                   BLOCK_E=block, BLOCK_K=triton.next_power_of_2(k), BLOCK_D=block_d,
                                   W_FIRST=_w_first(weight, D, block_d), num_warps=warps, **pdl_launch(rows_in))
    return index, out, h, stream


def softmax_topk_triton(logits: Tensor, k: int, renormalise: bool,
                        weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`SoftmaxTopKRouter`'s selection. logits: [N, E] -> (index [N, k] int64, weight [N, k] in logits' dtype).
    Given the router `weight` [E, D], the first argument is x [N, D] and the kernel computes the logits."""
    return _softmax_topk(logits, k, renormalise, weight, None)[:2]


def add_rms_norm_softmax_topk_triton(x: Tensor, add_norm: AddNorm, k: int, renormalise: bool,
                                     weight: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`softmax_topk_triton` of h = RMSNorm(x + delta) with the router `weight` [E, D], in one launch ->
    (index, weight, h [N, D], stream x + delta [N, D]), h and the stream as `add_rms_norm_triton` gives them."""
    return _softmax_topk(x, k, renormalise, weight, add_norm)


def _group_topk(logits: Tensor, bias: Tensor, k: int, n_group: int, topk_group: int, renormalise: bool,
                scaling: float, weight: Tensor | None,
                add_norm: AddNorm | None) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    E = logits.shape[1] if weight is None else weight.shape[0]
    assert E % n_group == 0 and E // n_group >= 2 and 1 <= topk_group <= n_group, \
        f"{E} experts in {n_group} groups, {topk_group} kept"
    assert bias.shape == (E,) and bias.is_contiguous(), f"bias {tuple(bias.shape)}"
    assert weight is None or weight.dtype == torch.float32, "TopKRouter's weight is fp32"
    block_g, block_eg = triton.next_power_of_2(n_group), triton.next_power_of_2(E // n_group)
    (index, out), (rows_in, w, D, rows, block_d, grid, warps) = _prepare(logits, E, block_g * block_eg, k,
                                                                        torch.float32, weight)
    norm_ptrs, norm_flags, h, stream = _norm_args(rows_in, add_norm)
    N = logits.shape[0]
    if N:
        _group_topk_kernel[grid](rows_in, w, bias, index, out, N, D, rows_in.stride(0), float(scaling), *norm_ptrs,
                                 G=n_group, EG=E // n_group, TOPG=topk_group, K=k, NORM=renormalise,
                                 FROM_X=weight is not None, **norm_flags, ROWS=rows, BLOCK_G=block_g,
                                 BLOCK_EG=block_eg, BLOCK_K=triton.next_power_of_2(k), BLOCK_D=block_d,
                                 W_FIRST=_w_first(weight, D, block_d), num_warps=warps, **pdl_launch(rows_in))
    return index, out, h, stream


def group_topk_triton(logits: Tensor, bias: Tensor, k: int, n_group: int, topk_group: int, renormalise: bool,
                      scaling: float, weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`TopKRouter`'s selection. logits: [N, E] fp32; bias: [E] -> (index [N, k] int64, weight [N, k] fp32).
    Given the router `weight` [E, D] fp32, the first argument is x [N, D] (any float dtype, taken to fp32)
    and the kernel computes the logits. Needs E = n_group groups of >= 2 experts and topk_group <= n_group
    (what the config checks admit)."""
    return _group_topk(logits, bias, k, n_group, topk_group, renormalise, scaling, weight, None)[:2]


def add_rms_norm_group_topk_triton(x: Tensor, add_norm: AddNorm, bias: Tensor, k: int, n_group: int,
                                   topk_group: int, renormalise: bool, scaling: float,
                                   weight: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`group_topk_triton` of h = RMSNorm(x + delta) with the router `weight`, in one launch -> (index, weight,
    h, stream), as `add_rms_norm_softmax_topk_triton`'s."""
    return _group_topk(x, bias, k, n_group, topk_group, renormalise, scaling, weight, add_norm)
