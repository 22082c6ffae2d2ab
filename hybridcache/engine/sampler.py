"""Token choice: greedy, temperature with top-k / top-p, and speculative acceptance.

Greedy accepts a draft when it equals the argmax. With temperature the drafts (a point mass from the
n-gram drafter) pass through rejection sampling: draft `d` is kept with probability `p(d)`; on the first
rejection the token comes from `p` with `d` removed, renormalised; if all pass, a bonus token comes from
the last distribution. This leaves the output distribution exactly that of plain sampling.
"""
from __future__ import annotations

import torch

from .params import SamplingParams


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [T, V] fp32 -> probabilities [T, V] after temperature, top-k and top-p."""
    scaled = logits / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly ahead of each token
        drop = before >= params.top_p
        drop[..., 0] = False  # the likeliest token always stays: fp32 rounds a top_p below ~1e-45 to 0
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def choose(
    logits: torch.Tensor, drafts: list[int], params: SamplingParams, generator: torch.Generator | None
) -> list[int]:
    """logits [len(drafts) + 1, V] for the positions that predict each draft and the one after.

    Returns the accepted drafts followed by one new token (so 1..len(drafts)+1 tokens).
    """
    if params.greedy:
        best = logits.argmax(-1).tolist()
        out = []
        for i, d in enumerate(drafts):
            if best[i] != d:
                return out + [best[i]]
            out.append(d)
        return out + [best[len(drafts)]]
    probs = probabilities(logits.float().cpu(), params)
    out = []
    for i, d in enumerate(drafts):
        p = probs[i]
        if float(torch.rand((), generator=generator)) < float(p[d]):
            out.append(d)
            continue
        residual = p.clone()
        residual[d] = 0.0
        return out + [_draw(residual / residual.sum(), generator)]
    return out + [_draw(probs[len(drafts)], generator)]
