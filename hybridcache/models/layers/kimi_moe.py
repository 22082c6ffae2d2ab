"""Kimi Linear's MoE: gated experts (w1 / w3 / w2 per expert) behind the sigmoid group-limited `TopKRouter`,
plus gated shared experts."""
from __future__ import annotations

import torch
from torch import nn

from ...parallel import SINGLE, TPGroup
from .experts import GatedExperts
from .gated_mlp import GatedMLP
from .routers import TopKRouter

EXPERT_NAMES = ("w1", "w3", "w2")  # gate, up, down as Kimi's checkpoints spell them


class KimiMoE(nn.Module):
    """`experts(x) + shared_experts(x)`; checkpoint names under `block_sparse_moe.` (or `mlp.`): `gate.weight`,
    `gate.e_score_correction_bias`, `experts.{e}.w{1,2,3}.weight`, `shared_experts.{gate,up,down}_proj.weight`."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, inner: int, num_shared: int, act: str,
                 n_group: int, topk_group: int, norm_topk_prob: bool, scaling: float,
                 device: torch.device | str, dtype: torch.dtype, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.gate = TopKRouter(hidden, num_experts, top_k, n_group, topk_group, norm_topk_prob, scaling, device)
        self.experts = GatedExperts(num_experts, hidden, inner, act, device, dtype, EXPERT_NAMES, tp)
        self.shared_experts = GatedMLP(hidden, inner * num_shared, act, device, dtype, tp) if num_shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D] (partial under tensor parallelism: experts expert-internal, shared experts
        over their intermediate size, the router replicated)."""
        return self.forward_routed(x, *self.gate(x))

    def forward_routed(self, x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`forward` given the router's choice for x (`gate.add_norm_route` may have made x and the choice in
        one launch: `DecoderLayer.residual`)."""
        if self.shared_experts is None:
            return self.experts(x, index, weight)
        shared = self.shared_experts.as_shared_expert()
        if self.experts.folds_shared(x, index, shared):  # one pair a token more in the experts' kernels
            return self.experts(x, index, weight, shared=shared)
        return self.experts(x, index, weight) + self.shared_experts(x)
