"""Mixture of experts with a softmax top-k router, gated experts, and a shared expert behind a sigmoid gate."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.triton_support import runs_triton
from ...parallel import SINGLE, TPGroup
from .experts import GatedExperts
from .gated_mlp import GatedMLP
from .routers import SoftmaxTopKRouter


class SharedExpertMoE(nn.Module):
    """gate (router), experts, shared_expert (gated MLP), shared_expert_gate `[1, D]`:
    `experts(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)`, the shared gate one more row of the
    shared expert's gate/up GEMM and the sum one launch on CUDA. Tensor parallel: routers and the
    shared gate replicated, experts expert-internal, the shared expert over its intermediate size; the
    output is this rank's partial sum (the gate scales each partial alike). Where the experts' fused
    kernels take the batch (decode, verify), the shared expert and its gate run inside them as S / I more
    pairs a token (`GatedExperts.takes_shared`): three launches for the layer's experts in place of
    seven."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, inner: int, shared_inner: int, act: str,
                 norm_topk_prob: bool, device: torch.device | str, dtype: torch.dtype, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.gate = SoftmaxTopKRouter(hidden, num_experts, top_k, norm_topk_prob, device, dtype)
        self.experts = GatedExperts(num_experts, hidden, inner, act, device, dtype, tp=tp)
        self.shared_expert = GatedMLP(hidden, shared_inner, act, device, dtype, tp, extra_rows=1)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """shared_expert_gate `[1, D]`: the last row of the shared expert's gate/up GEMM (replicated)."""
        return {"shared_expert_gate.weight": self.shared_expert.extra_weight}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D] (partial under tensor parallelism)."""
        return self.forward_routed(x, *self.gate(x))

    def forward_routed(self, x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`forward` given the router's choice for x (`gate.add_norm_route` may have made x and the choice in
        one launch: `DecoderLayer.residual`)."""
        fused = self.shared_expert.as_shared_expert(gate_logit=True)
        if self.experts.folds_shared(x, index, fused):  # S / I more pairs a token in the experts' kernels
            return self.experts(x, index, weight, shared=fused)
        shared, logit = self.shared_expert.forward_extra(x)
        routed = self.experts(x, index, weight)
        if runs_triton(x):
            from ...ops.activation_triton import sigmoid_gated_add_triton

            return sigmoid_gated_add_triton(routed, shared, logit)
        return routed + torch.sigmoid(logit) * shared
