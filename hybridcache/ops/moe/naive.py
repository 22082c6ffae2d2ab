"""Readable per-token references for the MoE kernels: the experts one (token, k) pair at a time, and the
routers' selections one token at a time, in torch ops with the kernels' rounding points spelled out."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

_ACT = {"relu2": lambda v: torch.square(F.relu(v)), "relu": F.relu, "silu": F.silu, "gelu": F.gelu}


def _expert(row: Tensor, up: Tensor, down: Tensor, gate: Tensor | None, act: str) -> Tensor:
    u = F.linear(row, up)
    h = _ACT[act](u) if gate is None else _ACT[act](F.linear(row, gate)) * u
    return F.linear(h, down)


def fused_experts_naive(x: Tensor, index: Tensor, weight: Tensor, up: Tensor, down: Tensor,
                        gate: Tensor | None, act: str, out_dtype: torch.dtype, shared=None) -> Tensor:
    """`sum_j weight[n, j] * expert(index[n, j], x[n])` token by token, k in order, then `+ shared(x[n])`
    where a `SharedExpert` is given. x: [N, D]; index, weight: [N, k]; up, gate: [E, I, D]; down: [E, D, I]
    -> [N, D] in out_dtype.

    Each GEMM's output is in x's dtype, the activation runs on it (fp32 inside, one rounding), each expert's
    output is cast to out_dtype, multiplied by its weight in the promoted dtype, cast back and summed; the
    shared expert's output (times sigmoid(gate_logit · x), where it has one) is cast to out_dtype and added."""
    out = torch.zeros(x.shape[0], x.shape[1], device=x.device, dtype=out_dtype)
    for n in range(x.shape[0]):
        row = x[n:n + 1]
        for j in range(index.shape[1]):
            e = int(index[n, j])
            y = _expert(row, up[e], down[e], None if gate is None else gate[e], act).to(out_dtype)
            out[n] = out[n] + (y[0] * weight[n, j]).to(out_dtype)
        if shared is not None:
            y = _expert(row, shared.up, shared.down, shared.gate, act)[0]
            if shared.gate_logit is not None:  # sigmoid and product in x's dtype (= out_dtype)
                y = torch.sigmoid(F.linear(row, shared.gate_logit[None]))[0] * y
            out[n] = out[n] + y.to(out_dtype)
    return out


def _top(values: list[float], k: int) -> list[int]:
    """The indices of the k largest values, largest first, the lowest index first among equal values."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]


def softmax_topk_naive(logits: Tensor, k: int, renormalise: bool) -> tuple[Tensor, Tensor]:
    """logits: [N, E] -> (index [N, k] int64, weight [N, k] in logits' dtype): the k largest of
    softmax(logits) in fp32, divided by their sum when `renormalise`."""
    index, weight = [], []
    for row in logits.float():
        probs = torch.softmax(row, dim=-1)
        top = _top(probs.tolist(), k)
        w = probs[top]
        weight.append(w / w.sum() if renormalise else w)
        index.append(top)
    return (torch.tensor(index, dtype=torch.int64, device=logits.device).view(-1, k),
            torch.stack(weight).to(logits.dtype) if weight else logits.new_empty(0, k))


def group_topk_naive(logits: Tensor, bias: Tensor, k: int, n_group: int, topk_group: int, renormalise: bool,
                     scaling: float) -> tuple[Tensor, Tensor]:
    """logits: [N, E] (fp32); bias: [E] -> (index [N, k] int64, weight [N, k] fp32). Scores sigmoid(logits);
    choice by score + bias among the experts of the `topk_group` groups whose two best choices sum highest;
    weights the chosen scores (/ (sum + 1e-20) when `renormalise`) times `scaling`."""
    size = logits.shape[1] // n_group
    index, weight = [], []
    for row in logits.float():
        scores = torch.sigmoid(row)
        choice = (scores + bias.float()).tolist()
        group_score = []
        for g in range(n_group):
            first, second = _top(choice[g * size:(g + 1) * size], 2)
            group_score.append(choice[g * size + first] + choice[g * size + second])
        kept = set(_top(group_score, topk_group))
        masked = [c if e // size in kept else float("-inf") for e, c in enumerate(choice)]
        top = _top(masked, k)
        w = scores[top]
        if renormalise:
            w = w / (w.sum() + 1e-20)
        weight.append(w * scaling)
        index.append(top)
    return (torch.tensor(index, dtype=torch.int64, device=logits.device).view(-1, k),
            torch.stack(weight) if weight else logits.new_empty(0, k, dtype=torch.float32))
