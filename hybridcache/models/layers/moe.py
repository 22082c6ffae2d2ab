"""Mixture of experts with a sigmoid top-k router (group-limited), non-gated experts and a shared expert."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .mlp import ACTIVATIONS, MLP, Linear
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
        scores = F.linear(x.float(), self.weight.float()).sigmoid()  # [N, E]
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


class Experts(nn.Module):
    """Stacked expert weights: up `[E, I, Din]`, down `[E, Din, I]`; checkpoints hold one tensor per expert."""

    def __init__(self, num_experts: int, d_in: int, inner: int, act: str,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.up = param(num_experts, inner, d_in, device=device, dtype=dtype)
        self.down = param(num_experts, d_in, inner, device=device, dtype=dtype)
        self.act = ACTIVATIONS[act]

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for e in range(self.up.shape[0]):
            out[f"{e}.up_proj.weight"] = self.up[e]
            out[f"{e}.down_proj.weight"] = self.down[e]
        return out

    def forward(self, x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x: [N, Din]; index, weight: [N, k]. Returns sum_k weight * expert(x), [N, Din] fp32.

        Token copies are sorted by expert so each expert runs one matmul over its contiguous run; the run
        lengths are read on the host (one sync per layer).
        """
        n, k = index.shape
        flat = index.flatten()
        order = flat.argsort(stable=True)
        token = order // k
        counts = torch.bincount(flat, minlength=self.up.shape[0]).tolist()
        xs = x[token]
        out = torch.empty(n * k, x.shape[1], device=x.device, dtype=torch.float32)
        start = 0
        for e, count in enumerate(counts):
            if count:
                h = self.act(F.linear(xs[start : start + count], self.up[e]))
                out[start : start + count] = F.linear(h, self.down[e]).float()
            start += count
        out.mul_(weight.flatten()[order, None].float())
        return torch.zeros(n, x.shape[1], device=x.device, dtype=torch.float32).index_add_(0, token, out)


class MoE(nn.Module):
    """gate (router), experts, shared_experts, and optional fc1/fc2 latent projections around the experts."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, inner: int, shared_inner: int,
                 latent: int | None, act: str, bias: bool, n_group: int, topk_group: int,
                 norm_topk_prob: bool, scaling: float, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate = TopKRouter(hidden, num_experts, top_k, n_group, topk_group, norm_topk_prob, scaling, device)
        self.experts = Experts(num_experts, latent or hidden, inner, act, device, dtype)
        self.shared_experts = MLP(hidden, shared_inner, act, bias, device, dtype)
        self.fc1_latent_proj = Linear(hidden, latent, bias, device, dtype) if latent else None
        self.fc2_latent_proj = Linear(latent, hidden, bias, device, dtype) if latent else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D]."""
        index, weight = self.gate(x)
        h = self.fc1_latent_proj(x) if self.fc1_latent_proj is not None else x
        h = self.experts(h, index, weight).to(x.dtype)
        if self.fc2_latent_proj is not None:
            h = self.fc2_latent_proj(h)
        return h + self.shared_experts(x)
