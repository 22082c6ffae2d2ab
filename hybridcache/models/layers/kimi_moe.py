"""Kimi Linear's MoE: gated experts (w1 / w3 / w2 per expert) behind the sigmoid group-limited `TopKRouter`,
plus gated shared experts."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .gated_mlp import GatedMLP
from .mlp import ACTIVATIONS
from .moe import TopKRouter
from .params import param


class GatedExperts(nn.Module):
    """Stacked expert weights w1 (gate) and w3 (up) `[E, I, D]`, w2 (down) `[E, D, I]`; checkpoints hold one
    tensor per expert and weight: `{e}.w1.weight`, `{e}.w2.weight`, `{e}.w3.weight`."""

    def __init__(self, num_experts: int, hidden: int, inner: int, act: str,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.w1 = param(num_experts, inner, hidden, device=device, dtype=dtype)
        self.w3 = param(num_experts, inner, hidden, device=device, dtype=dtype)
        self.w2 = param(num_experts, hidden, inner, device=device, dtype=dtype)
        self.act = ACTIVATIONS[act]

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        names = ("w1", "w2", "w3")
        return {f"{e}.{n}.weight": getattr(self, n)[e] for e in range(self.w1.shape[0]) for n in names}

    def forward(self, x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x: [N, D]; index, weight: [N, k]. Returns sum_k weight * expert(x), [N, D] in x's dtype.

        Token copies are sorted by expert so each expert runs one matmul over its contiguous run (one host
        sync per layer for the run lengths).
        """
        n, k = index.shape
        flat = index.flatten()
        order = flat.argsort(stable=True)
        token = order // k
        counts = torch.bincount(flat, minlength=self.w1.shape[0]).tolist()
        xs = x[token]
        out = torch.empty(n * k, x.shape[1], device=x.device, dtype=x.dtype)
        start = 0
        for e, count in enumerate(counts):
            if count:
                run = xs[start : start + count]
                h = self.act(F.linear(run, self.w1[e])) * F.linear(run, self.w3[e])
                out[start : start + count] = F.linear(h, self.w2[e])
            start += count
        out = out * weight.flatten()[order, None]  # fp32 weights, as transformers multiplies
        return torch.zeros_like(x).index_add_(0, token, out.to(x.dtype))


class KimiMoE(nn.Module):
    """`experts(x) + shared_experts(x)`; checkpoint names under `block_sparse_moe.` (or `mlp.`): `gate.weight`,
    `gate.e_score_correction_bias`, `experts.{e}.w{1,2,3}.weight`, `shared_experts.{gate,up,down}_proj.weight`."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, inner: int, num_shared: int, act: str,
                 n_group: int, topk_group: int, norm_topk_prob: bool, scaling: float,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate = TopKRouter(hidden, num_experts, top_k, n_group, topk_group, norm_topk_prob, scaling, device)
        self.experts = GatedExperts(num_experts, hidden, inner, act, device, dtype)
        self.shared_experts = GatedMLP(hidden, inner * num_shared, act, device, dtype) if num_shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D]."""
        index, weight = self.gate(x)
        h = self.experts(x, index, weight)
        return h if self.shared_experts is None else h + self.shared_experts(x)
