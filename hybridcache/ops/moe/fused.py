"""The experts' Triton forward for decode-sized batches: one program a pair up to MAX_PAIRS pairs (each reads
its expert's weights, L2 shares them), the pairs sorted by expert up to MAX_SORTED_PAIRS (each expert's
weights read once per block of pairs). Imported only where Triton runs."""
from __future__ import annotations

import torch
from torch import Tensor

from . import MAX_PAIRS, SharedExpert, experts_sorted_triton, experts_triton


def fused_experts(x: Tensor, index: Tensor, weight: Tensor, up: Tensor, down: Tensor, gate: Tensor | None,
                  act: str, out_dtype: torch.dtype, shared: SharedExpert | None = None) -> Tensor:
    """`sum_j weight[:, j] * expert(index[:, j], x)`, then `+ shared(x)` where given: the arguments and
    roundings of `experts_triton.fused_experts_triton`. x: [N, D]; index, weight: [N, k] -> [N, D] in out_dtype.
    The pairs counted are N·k, plus N with a shared expert."""
    if index.shape[0] * (index.shape[1] + (shared is not None)) <= MAX_PAIRS:
        return experts_triton.fused_experts_triton(x, index, weight, up, down, gate, act, out_dtype, shared=shared)
    order, ends = experts_sorted_triton.sort_pairs_triton(index, up.shape[0], shared=shared is not None)
    return experts_sorted_triton.sorted_experts_triton(x, index, weight, order, ends, up, down, gate, act, out_dtype,
                                                       shared=shared)
