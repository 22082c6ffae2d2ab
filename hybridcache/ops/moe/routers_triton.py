"""The routers' selection from their logits as one Triton launch each (the router GEMM stays a torch
`F.linear`): one program a token, the token's E logits in registers; no host sync.

softmax_topk_triton   p = softmax(logits) in fp32; the k largest p; weights p (/ their sum when `renormalise`),
                      cast to the logits' dtype                                   (`SoftmaxTopKRouter`)
group_topk_triton     s = sigmoid(logits), c = s + bias; the experts in `n_group` groups of E / n_group,
                      a group scored by the sum of its two largest c; the `topk_group` best groups kept,
                      the k largest c among their experts; weights s of those (/ (their sum + 1e-20) when
                      `renormalise`) times `scaling`, fp32                          (`TopKRouter`)

Ties: every selection takes the lowest index among equal values (torch.topk's order on the CPU, on every
selection here: experts, a group's best two, groups). The top k come out in descending value order, as
torch.topk's `sorted=True` gives them. Against torch in fp32, exp and the divisions differ by an ulp or so,
so a choice can differ from torch's only between values that close (random logits never are).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..rms_norm_triton import _round
from . import ROUTER_MAX_EXPERTS


# tl.reduce with these is tl.max / tl.min / tl.sum on fp32 and int32 without a nested jit call (each costs the
# interpreter ~1 ms): the kernels below call only builtins (tl.full, not tl.zeros) and inline their selection
_MAX, _MIN, _SUM = tl.standard._elementwise_max, tl.standard._elementwise_min, tl.standard._sum_combine


@triton.jit
def _softmax_topk_kernel(logits_ptr, index_ptr, weight_ptr, N, stride_n,
                         E: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr,
                         ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_E)[None, :]
    valid = (n < N)[:, None] & (c < E)
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
def _group_topk_kernel(logits_ptr, bias_ptr, index_ptr, weight_ptr, N, stride_n, scaling,
                       G: tl.constexpr, EG: tl.constexpr, TOPG: tl.constexpr, K: tl.constexpr,
                       NORM: tl.constexpr, ROWS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_EG: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.arange(0, BLOCK_G)
    c = tl.arange(0, BLOCK_EG)
    expert3 = g[None, :, None] * EG + c[None, None, :]  # [1, BLOCK_G, BLOCK_EG]
    valid3 = (n < N)[:, None, None] & (g < G)[None, :, None] & (c < EG)[None, None, :]
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


def _outputs(logits: Tensor, k: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    N, E = logits.shape
    assert 1 <= k <= E, f"top {k} of {E} experts"
    assert E <= ROUTER_MAX_EXPERTS, f"{E} experts: over the router kernels' {ROUTER_MAX_EXPERTS}"
    return (torch.empty(N, k, device=logits.device, dtype=torch.int64),
            torch.empty(N, k, device=logits.device, dtype=dtype))


def _launch(logits: Tensor, block: int) -> tuple[Tensor, int, tuple[int], int]:
    """(logits with a unit last stride, ROWS, grid, num_warps) for rows of `block` padded experts: one token
    a program on CUDA (decode batches are small, every token its own SM); the interpreter, which runs
    programs one by one at a fixed cost each, takes up to 64 tokens a program."""
    N = logits.shape[0]
    rows = 1 if logits.is_cuda else min(64, triton.next_power_of_2(N))
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    return logits, rows, (triton.cdiv(N, rows),), min(8, max(1, rows * block // 256))


def softmax_topk_triton(logits: Tensor, k: int, renormalise: bool) -> tuple[Tensor, Tensor]:
    """`SoftmaxTopKRouter`'s selection. logits: [N, E] -> (index [N, k] int64, weight [N, k] in logits' dtype)."""
    index, weight = _outputs(logits, k, logits.dtype)
    N, E = logits.shape
    if N:
        block = triton.next_power_of_2(E)
        logits, rows, grid, warps = _launch(logits, block)
        _softmax_topk_kernel[grid](logits, index, weight, N, logits.stride(0), E=E, K=k, NORM=renormalise,
                                   ROWS=rows, BLOCK_E=block, BLOCK_K=triton.next_power_of_2(k), num_warps=warps)
    return index, weight


def group_topk_triton(logits: Tensor, bias: Tensor, k: int, n_group: int, topk_group: int, renormalise: bool,
                      scaling: float) -> tuple[Tensor, Tensor]:
    """`TopKRouter`'s selection. logits: [N, E] fp32; bias: [E] -> (index [N, k] int64, weight [N, k] fp32).
    Needs E = n_group groups of >= 2 experts and topk_group <= n_group (what the config checks admit)."""
    index, weight = _outputs(logits, k, torch.float32)
    N, E = logits.shape
    assert E % n_group == 0 and E // n_group >= 2 and 1 <= topk_group <= n_group, \
        f"{E} experts in {n_group} groups, {topk_group} kept"
    assert bias.shape == (E,) and bias.is_contiguous(), f"bias {tuple(bias.shape)}"
    if N:
        block_g, block_eg = triton.next_power_of_2(n_group), triton.next_power_of_2(E // n_group)
        logits, rows, grid, warps = _launch(logits, block_g * block_eg)
        _group_topk_kernel[grid](logits, bias, index, weight, N, logits.stride(0), float(scaling),
                                 G=n_group, EG=E // n_group, TOPG=topk_group, K=k, NORM=renormalise, ROWS=rows,
                                 BLOCK_G=block_g, BLOCK_EG=block_eg, BLOCK_K=triton.next_power_of_2(k),
                                 num_warps=warps)
    return index, weight
