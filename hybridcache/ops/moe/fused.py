"""The experts' Triton forward for decode-sized batches: one program a pair up to MAX_PAIRS pairs (each reads
its expert's weights, L2 shares them), the pairs sorted by expert up to MAX_SORTED_PAIRS (each expert's
weights read once per block of pairs). Imported only where Triton runs."""
from __future__ import annotations

import torch
from torch import Tensor

from . import MAX_PAIRS, SharedExpert, experts_sorted_triton, experts_triton, pairs


def fused_experts(x: Tensor, index: Tensor, weight: Tensor, up: Tensor, down: Tensor, gate: Tensor | None,
                  act: str, out_dtype: torch.dtype, shared: SharedExpert | None = None) -> Tensor:
    """`sum_j weight[:, j] * expert(index[:, j], x)`, then the shared expert's term where given: the arguments
    and roundings of `experts_triton.fused_experts_triton`. x: [N, D]; index, weight: [N, k] -> [N, D] in
    out_dtype. Up to MAX_PAIRS copies (`pairs`) one a program, above that sorted."""
    if pairs(index, up.shape[1], shared) <= MAX_PAIRS:
        return experts_triton.fused_experts_triton(x, index, weight, up, down, gate, act, out_dtype, shared=shared)
    parts = shared.parts(up.shape[1]) if shared is not None else 0
    order, ends = experts_sorted_triton.sort_pairs_triton(index, up.shape[0], shared=parts)
    return experts_sorted_triton.sorted_experts_triton(x, index, weight, order, ends, up, down, gate, act, out_dtype,
                                                       shared=shared)
