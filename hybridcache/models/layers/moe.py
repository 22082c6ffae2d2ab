"""NemotronH's mixture of experts: sigmoid top-k router (group-limited), non-gated experts, a shared expert."""
from __future__ import annotations

import torch
from torch import nn

from ...parallel import SINGLE, TPGroup
from ...parallel.linear import RowParallelLinear
from .experts import Experts
from .mlp import MLP, Linear
from .routers import TopKRouter


class MoE(nn.Module):
    """gate (router), experts, shared_experts, and optional fc1/fc2 latent projections around the experts.

    Tensor parallel: router and fc1 replicated; experts expert-internal and the shared expert over its
    intermediate size; fc2 is linear, so it maps each rank's partial expert sum (its bias on rank 0 only).
    The output is this rank's partial sum: one all-reduce by the caller."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, inner: int, shared_inner: int,
                 latent: int | None, act: str, bias: bool, n_group: int, topk_group: int,
                 norm_topk_prob: bool, scaling: float, device: torch.device | str, dtype: torch.dtype,
                 tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.gate = TopKRouter(hidden, num_experts, top_k, n_group, topk_group, norm_topk_prob, scaling, device)
        self.experts = Experts(num_experts, latent or hidden, inner, act, device, dtype, tp)
        self.shared_experts = MLP(hidden, shared_inner, act, bias, device, dtype, tp)
        self.fc1_latent_proj = Linear(hidden, latent, bias, device, dtype) if latent else None
        self.fc2_latent_proj = RowParallelLinear(latent, [(0, latent)], hidden, bias, tp, device, dtype) if latent else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D] (partial under tensor parallelism)."""
        index, weight = self.gate(x)
        h = self.fc1_latent_proj(x) if self.fc1_latent_proj is not None else x
        h = self.experts(h, index, weight).to(x.dtype)
        if self.fc2_latent_proj is not None:
            h = self.fc2_latent_proj(h)
        return h + self.shared_experts(x)
