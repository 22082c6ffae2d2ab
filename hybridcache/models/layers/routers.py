"""Expert routers: `x [N, D] -> (expert index [N, k], weight [N, k])`."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...ops import moe as moe_ops
from ...ops.moe import ROUTER_MAX_EXPERTS
from ...ops.triton_support import runs_triton
from .params import param


def _route_normed(router: nn.Module, x: torch.Tensor, delta: torch.Tensor, norm: nn.Module,
                  route: Callable) -> tuple[torch.Tensor, ...] | None:
    """`add_norm_route` of `router`: where `ops/moe.FOLD_NORM` is on and the router computes the logits of x
    [N, D] in its kernel (`fuses_logits`), route(x, AddNorm) -> (index, weight, h, stream) returned as (h, stream,
    index, weight); else None."""
    (n, d), e = x.shape, router.weight.shape[0]
    if not (moe_ops.FOLD_NORM and runs_triton(x) and e <= ROUTER_MAX_EXPERTS):
        return None
    from ...ops.moe.routers_triton import AddNorm, fuses_logits  # triton is imported only where it runs
    if not fuses_logits(n, e, d):
        return None
    index, weight, h, stream = route(x.contiguous(), AddNorm(delta.contiguous(), norm.weight.contiguous(),
                                                             norm.eps, norm.zero_centred))
    return h, stream, index, weight


class TopKRouter(nn.Module):
    """weight `[E, D]` and e_score_correction_bias `[E]`, both kept in fp32.

    Scores are sigmoid(logits); choice adds the correction bias, keeps the `topk_group` best of `n_group`
    expert groups (a group ranks by the sum of its two best choices) and takes the top `k` experts there.
    The chosen experts' (uncorrected) scores are the weights, normalised if `norm_topk_prob`, then scaled.
    """

    def __init__(self, hidden: int, num_experts: int, top_k: int, n_group: int, topk_group: int,
                 norm_topk_prob: bool, scaling: float, device: torch.device | str) -> None:
        super().__init__()
        self.weight = param(num_experts, hidden, device=device, dtype=torch.float32)
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts, device=device))
        self.top_k, self.n_group, self.topk_group = top_k, n_group, topk_group
        self.norm_topk_prob, self.scaling = norm_topk_prob, scaling

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [N, D] -> (expert index [N, k] int64, weight [N, k] fp32)."""
        (n, d), e = x.shape, self.weight.shape[0]
        fused = runs_triton(x) and e <= ROUTER_MAX_EXPERTS
        if fused:
            from ...ops.moe.routers_triton import fuses_logits, group_topk_triton  # triton only where it runs
            if fuses_logits(n, e, d):  # one launch: the cast, the GEMM and the selection
                return group_topk_triton(x, self.e_score_correction_bias, self.top_k, self.n_group,
                                         self.topk_group, self.norm_topk_prob, self.scaling, weight=self.weight)
        logits = F.linear(x.float(), self.weight.float())  # [N, E]
        if fused:
            return group_topk_triton(logits, self.e_score_correction_bias, self.top_k, self.n_group,
                                     self.topk_group, self.norm_topk_prob, self.scaling)
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        n, e = choice.shape
        grouped = choice.view(n, self.n_group, e // self.n_group)
        group_score = grouped.topk(2, dim=-1).values.sum(-1)  # [N, n_group]
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(self.topk_group, dim=-1).indices, True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(n, e)
        index = choice.topk(self.top_k, dim=-1).indices
        weight = scores.gather(1, index)
        if self.norm_topk_prob:
            weight = weight / (weight.sum(-1, keepdim=True) + 1e-20)
        return index, weight * self.scaling

    def add_norm_route(self, x: torch.Tensor, delta: torch.Tensor,
                       norm: nn.Module) -> tuple[torch.Tensor, ...] | None:
        """(h = norm(x + delta), x + delta, index, weight) in one launch with the RMSNorm `norm` run by the router
        (`routers_triton.add_rms_norm_group_topk_triton`), where `_route_normed` allows; else None."""
        def route(x, add_norm):
            from ...ops.moe.routers_triton import add_rms_norm_group_topk_triton
            return add_rms_norm_group_topk_triton(x, add_norm, self.e_score_correction_bias, self.top_k, self.n_group,
                                                  self.topk_group, self.norm_topk_prob, self.scaling, self.weight)

        return _route_normed(self, x, delta, norm, route)


class SoftmaxTopKRouter(nn.Module):
    """weight `[E, D]`; probabilities softmax(logits) in fp32, top k of them, renormalised if `norm_topk_prob`."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, norm_topk_prob: bool,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(num_experts, hidden, device=device, dtype=dtype)
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [N, D] -> (expert index [N, k] int64, weight [N, k] in x's dtype)."""
        (n, d), e = x.shape, self.weight.shape[0]
        fused = runs_triton(x) and e <= ROUTER_MAX_EXPERTS
        if fused:
            from ...ops.moe.routers_triton import fuses_logits, softmax_topk_triton
            if fuses_logits(n, e, d):  # one launch: the GEMM and the selection
                return softmax_topk_triton(x, self.top_k, self.norm_topk_prob, weight=self.weight)
        logits = F.linear(x, self.weight)
        if fused:
            return softmax_topk_triton(logits, self.top_k, self.norm_topk_prob)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weight, index = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weight = weight / weight.sum(-1, keepdim=True)
        return index, weight.to(logits.dtype)

    def add_norm_route(self, x: torch.Tensor, delta: torch.Tensor,
                       norm: nn.Module) -> tuple[torch.Tensor, ...] | None:
        """(h = norm(x + delta), x + delta, index, weight) in one launch with the RMSNorm `norm` run by the router
        (`routers_triton.add_rms_norm_softmax_topk_triton`), where `_route_normed` allows; else None."""
        def route(x, add_norm):
            from ...ops.moe.routers_triton import add_rms_norm_softmax_topk_triton
            return add_rms_norm_softmax_topk_triton(x, add_norm, self.top_k, self.norm_topk_prob, self.weight)

        return _route_normed(self, x, delta, norm, route)
