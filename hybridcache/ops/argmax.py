"""The samplers' argmax over the vocabulary: `argmax_triton` where TRITON_ARGMAX and Triton runs, else torch's (the
same values). Off until timed in the engine's steps (benchmarks/gpu/gemv_steps.sh with MODULE=argmax
SETTING=TRITON_ARGMAX VALUES="False True")."""
from __future__ import annotations

from torch import Tensor

from .triton_support import runs_triton

TRITON_ARGMAX = False


def argmax(logits: Tensor) -> Tensor:
    """logits [..., V] -> [...] int64: the first index of each row's maximum (a NaN counts as the maximum)."""
    if TRITON_ARGMAX and logits.shape[-1] and runs_triton(logits):
        from .argmax_triton import argmax_triton

        return argmax_triton(logits)
    return logits.argmax(-1)
