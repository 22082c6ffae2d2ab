"""Routed experts and their routers for small token counts (decode) as Triton kernels.

`experts_triton.fused_experts_triton`: the experts of a mixture in two launches (up/gate + activation per
(token, k) pair, then down + the router-weighted sum per token) for up to `MAX_PAIRS` token copies;
`experts_sorted_triton`: the copies sorted by expert (`sort.py`), a block of one expert's copies a program
(tl.dot), up to `MAX_SORTED_PAIRS`; `fused.py` picks between the two. Above it the sort-by-expert
grouped-GEMM path of `models/layers/experts.py` (cuBLAS/CUTLASS at large M) takes over.
`routers_triton`: the routers' selection from their logits (softmax top-k; sigmoid group-limited top-k).
`SharedExpert`: an expert every token takes with weight 1 (Kimi's shared expert), run by the same kernels
as one more pair a token. `naive.py`: the per-token references. The Triton modules are imported only where
they run (CUDA, or the CPU interpreter in tests); this package's root imports no triton.
"""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

MAX_PAIRS = 16  # token copies (N * k) up to which the experts take the one-pair-a-program kernels
MAX_SORTED_PAIRS = 1024  # and up to which they take the sorted kernels
ROUTER_MAX_EXPERTS = 4096  # experts a router kernel holds in one program's registers
ACTIVATIONS = ("relu2", "relu", "silu", "gelu")  # what the kernels compute, as models/layers/mlp.py names them


class SharedExpert(NamedTuple):
    """One expert's weights outside the routed stack: up, gate [I, D] (gate None: non-gated), down [D, I]."""

    up: Tensor
    down: Tensor
    gate: Tensor | None

    def fits(self, up: Tensor, down: Tensor, gate: Tensor | None) -> bool:
        """Whether the kernels can run it as one more expert of the stack up, gate [E, I, D], down [E, D, I]:
        the same shapes, row strides and dtype as one routed expert, gated alike."""
        def like(t: Tensor | None, stack: Tensor | None) -> bool:
            if t is None or stack is None:
                return t is None and stack is None
            return (t.shape == stack.shape[1:] and t.stride() == stack.stride()[1:] and t.dtype == stack.dtype
                    and t.device == stack.device)
        return like(self.up, up) and like(self.down, down) and like(self.gate, gate)


__all__ = ["ACTIVATIONS", "MAX_PAIRS", "MAX_SORTED_PAIRS", "ROUTER_MAX_EXPERTS", "SharedExpert"]
