"""Expert routers: `x [N, D] -> (expert index [N, k], weight [N, k])`."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.moe import ROUTER_MAX_EXPERTS
from ...ops.triton_support import runs_triton
from .params import param


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
