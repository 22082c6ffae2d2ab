"""Mixture of experts with a softmax top-k router, gated experts, and a shared expert behind a sigmoid gate."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .gated_mlp import GatedMLP
from .mlp import ACTIVATIONS, Linear
from .params import param


class SoftmaxTopKRouter(nn.Module):
    """weight `[E, D]`; probabilities softmax(logits) in fp32, top k of them, renormalised if `norm_topk_prob`."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, norm_topk_prob: bool,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = param(num_experts, hidden, device=device, dtype=dtype)
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [N, D] -> (expert index [N, k] int64, weight [N, k] in x's dtype)."""
        logits = F.linear(x, self.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weight, index = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weight = weight / weight.sum(-1, keepdim=True)
        return index, weight.to(logits.dtype)


class GatedExperts(nn.Module):
    """Stacked expert weights: gate, up `[E, I, D]`, down `[E, D, I]`; checkpoints hold one tensor per expert
    (`{e}.gate_proj.weight`, `{e}.up_proj.weight`, `{e}.down_proj.weight`)."""

    def __init__(self, num_experts: int, hidden: int, inner: int, act: str,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate = param(num_experts, inner, hidden, device=device, dtype=dtype)
        self.up = param(num_experts, inner, hidden, device=device, dtype=dtype)
        self.down = param(num_experts, hidden, inner, device=device, dtype=dtype)
        self.act = ACTIVATIONS[act]

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for e in range(self.gate.shape[0]):
            out[f"{e}.gate_proj.weight"] = self.gate[e]
            out[f"{e}.up_proj.weight"] = self.up[e]
            out[f"{e}.down_proj.weight"] = self.down[e]
        return out

    def forward(self, x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x: [N, D]; index, weight: [N, k] -> sum_k weight * expert(x), [N, D] in x's dtype.

        Token copies are sorted by expert so that each expert runs one matmul over its contiguous run; the
        run lengths are read on the host (one sync per layer).
        """
        n, k = index.shape
        flat = index.flatten()
        order = flat.argsort(stable=True)
        token = order // k
        counts = torch.bincount(flat, minlength=self.gate.shape[0]).tolist()
        xs = x[token]
        out = torch.empty_like(xs)
        start = 0
        for e, count in enumerate(counts):
            if count:
                h = xs[start : start + count]
                h = self.act(F.linear(h, self.gate[e])) * F.linear(h, self.up[e])
                out[start : start + count] = F.linear(h, self.down[e])
            start += count
        out = out * weight.flatten()[order, None]
        return torch.zeros_like(x).index_add_(0, token, out)


class SharedExpertMoE(nn.Module):
    """gate (router), experts, shared_expert (gated MLP), shared_expert_gate `[1, D]`:
    `experts(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)`."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, inner: int, shared_inner: int, act: str,
                 norm_topk_prob: bool, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate = SoftmaxTopKRouter(hidden, num_experts, top_k, norm_topk_prob, device, dtype)
        self.experts = GatedExperts(num_experts, hidden, inner, act, device, dtype)
        self.shared_expert = GatedMLP(hidden, shared_inner, act, device, dtype)
        self.shared_expert_gate = Linear(hidden, 1, False, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D]."""
        index, weight = self.gate(x)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.experts(x, index, weight) + shared
