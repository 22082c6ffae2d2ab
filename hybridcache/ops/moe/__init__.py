"""Routed experts and their routers for small token counts (decode) as Triton kernels.

`experts_triton.fused_experts_triton`: the experts of a mixture in two launches (up/gate + activation per
(token, k) pair, then down + the router-weighted sum per token) for up to `MAX_PAIRS` token copies;
`experts_sorted_triton`: the copies sorted by expert (`sort.py`), a block of one expert's copies a program
(tl.dot), up to `MAX_SORTED_PAIRS`; `fused.py` picks between the two. Above it the sort-by-expert
grouped-GEMM path of `models/layers/experts.py` (cuBLAS/CUTLASS at large M) takes over.
`routers_triton`: the routers' selection from their logits (softmax top-k; sigmoid group-limited top-k).
`SharedExpert`: an expert every token takes (Kimi's, with weight 1; Qwen3-Next's, wider than a routed
one and scaled by a sigmoid gate of its own), run by the same kernels as `parts` more pairs a token. `naive.py`: the per-token references. The Triton modules are imported only where
they run (CUDA, or the CPU interpreter in tests); this package's root imports no triton.
"""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

MAX_PAIRS = 16  # token copies (N * k) up to which the experts take the one-pair-a-program kernels
MAX_SORTED_PAIRS = 1024  # and up to which they take the sorted kernels
ROUTER_MAX_EXPERTS = 4096  # experts a router kernel holds in one program's registers
# A pre-norm decoder layer's second residual add and RMSNorm run in its mixture's router launch, where the router
# computes its logits (`routers_triton.add_rms_norm_*`, `models/layers/routers.py` add_norm_route): one launch a
# MoE layer fewer. H100, batch-1 graph steps (benchmarks/gpu/gemv_steps.sh, MODULE=moe SETTING=FOLD_NORM), replay
# ms off against on over two calls: kimi_linear 0.6009 / 0.6024 against 0.5960 / 0.5969 (150 -> 139 launches,
# 1,564-1,568 tok/s against 1,578-1,585), qwen3_next 0.7821 / 0.7841 against 0.7781 / 0.7797 (135 -> 123,
# 1,219-1,224 against 1,225-1,229).
FOLD_NORM = True
ACTIVATIONS = ("relu2", "relu", "silu", "gelu")  # what the kernels compute, as models/layers/mlp.py names them


class SharedExpert(NamedTuple):
    """One expert's weights outside the routed stack: up, gate [S, D] (gate None: non-gated), down [D, S];
    `gate_logit` [D] (or None): its output is scaled by sigmoid(gate_logit · x) (Qwen3-Next's
    shared_expert_gate), else by 1. S may be any multiple of the routed experts' I: the kernels take its
    up/gate rows as S / I pairs of I rows each (`parts`), and its down product over all S at once."""

    up: Tensor
    down: Tensor
    gate: Tensor | None
    gate_logit: Tensor | None = None

    def parts(self, inner: int) -> int:
        """Pairs a token the shared expert takes beside routed experts of intermediate size `inner`."""
        return self.up.shape[0] // inner

    def fits(self, up: Tensor, down: Tensor, gate: Tensor | None) -> bool:
        """Whether the kernels can run it beside the stack up, gate [E, I, D], down [E, D, I]: S a multiple of
        I, the same D, dtype and device, unit last strides, gate laid out as up, gated alike."""
        (_, inner, d), w = up.shape, self.up
        if (gate is None) != (self.gate is None) or w.ndim != 2 or w.shape[0] % inner or w.shape[1] != d:
            return False
        mats = [w, self.down] + ([self.gate] if self.gate is not None else [])
        if self.gate is not None and (self.gate.shape != w.shape or self.gate.stride() != w.stride()):
            return False
        if self.gate_logit is not None:
            if self.gate_logit.shape != (d,):
                return False
            mats.append(self.gate_logit[None])
        return (self.down.shape == (d, w.shape[0]) and all(t.stride(-1) == 1 for t in mats)
                and all(t.dtype == up.dtype and t.device == up.device for t in mats))


def pairs(index: Tensor, inner: int, shared: SharedExpert | None = None) -> int:
    """The token copies the kernels take for `index` [N, k] over experts of intermediate size `inner`: N·k,
    plus N·M with a shared expert of M = S / I parts."""
    return index.shape[0] * (index.shape[1] + (shared.parts(inner) if shared is not None else 0))


__all__ = ["ACTIVATIONS", "FOLD_NORM", "MAX_PAIRS", "MAX_SORTED_PAIRS", "ROUTER_MAX_EXPERTS", "SharedExpert", "pairs"]
