"""The model's GEMMs, `x @ weight.T (+ bias)` (torch's: cuBLAS on CUDA), in one place, and the activations
that follow a GEMM where one launch on its output replaces torch's two or three: relu(y)², and silu(gate) * up
over one gate/up GEMM's halves.

A one-launch skinny Triton GEMM with these activations (and the mixers' conv update) in its epilogue lost to cuBLAS
in the engine on an H100 (nemotron_h 1b graph step 1.13 vs 1.02 ms at batch 1, 1.85 vs 1.35 ms at batch 16) and was
removed; it is in the history at commits 42922fe and b7b5b70. Up to GEMV_ROWS rows (0: none) take `gemv_triton` (no
tensor cores, one launch) where Triton runs, and one row does: batch-1 graph steps on an H100, back to back
(benchmarks/gpu/gemv_steps.sh), gave nemotron_h 1,195 tok/s against cuBLAS's 1,024, qwen3_next 1,198 against 1,122
and kimi_linear 1,414 against 1,424; at 2 and 4 rows cuBLAS is faster on most shapes (benchmarks/gpu/gemv.sh).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .triton_support import runs_triton

GEMV_ROWS = 1
# A pre-norm block's residual add and RMSNorm folded into its first GEMM where that takes the gemv (one row), or
# into its mixture's router: one launch instead of two (`gemv_triton.add_rms_norm_gemv_triton`,
# `moe/routers_triton.add_rms_norm_*_topk_triton`, `models/layers/prenorm.py`). Off: not yet timed
# (benchmarks/gpu/norm_gemv.sh).
FUSE_NORM = False
# The MLP activation before a down projection (relu(x)², silu(gate)·up) applied to the gemv's input as it loads
# it (`gemv_triton(act=...)`): one launch instead of two, the same values. Off: not yet timed.
FUSE_ACT = False
# A mixer's gated RMSNorm folded into the projection after it at one row (`gemv_triton.gated_norm_gemv_triton`,
# `models/layers/norm.GatedNorm.project`): one launch instead of two. Off: not yet timed.
FUSE_GATED_NORM = False


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [M, K], weight [N, K], bias [N] or None -> [M, N]."""
    if x.dim() == 2 and 0 < x.shape[0] <= GEMV_ROWS and runs_triton(x):
        from .gemv_triton import gemv_triton

        return gemv_triton(x, weight, bias)
    return F.linear(x, weight, bias)


def fuses_norm(x: Tensor) -> bool:
    """Whether a norm over x [M, K] and the GEMM after it run as one launch (`add_rms_norm_gemv_triton`)."""
    return FUSE_NORM and x.dim() == 2 and x.shape[0] == 1 <= GEMV_ROWS and runs_triton(x)


def activated_linear(x: Tensor, act: str, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`linear(relu2(x), weight, bias)` (act "relu2", x [M, K]) or `linear(silu_mul(x, K), weight, bias)` (act
    "silu_mul", x [M, >= 2K]), K = weight's width; one launch where the gemv runs and FUSE_ACT is on."""
    if FUSE_ACT and x.dim() == 2 and 0 < x.shape[0] <= GEMV_ROWS and runs_triton(x):
        from .gemv_triton import gemv_triton

        return gemv_triton(x, weight, bias, act=act)
    if act == "relu2":
        return linear(relu2(x), weight, bias)
    if act == "silu_mul":
        return linear(silu_mul(x, weight.shape[1]), weight, bias)
    raise ValueError(f"act {act!r}: 'relu2' or 'silu_mul'")


def fuses_gated_norm(y: Tensor) -> bool:
    """Whether a gated norm over one row y [1, ...] and the projection after it run as one launch."""
    return FUSE_GATED_NORM and y.shape[0] == 1 <= GEMV_ROWS and runs_triton(y)


def relu2(x: Tensor) -> Tensor:
    """relu(x)², one launch where Triton runs (`activation_triton.relu2_triton`, the same values)."""
    if runs_triton(x) and x.is_contiguous():
        from .activation_triton import relu2_triton

        return relu2_triton(x)
    return torch.square(F.relu(x))


def silu_mul(h: Tensor, inner: int) -> Tensor:
    """silu(h[:, :inner]) * h[:, inner:2·inner], one launch where Triton runs (`activation_triton.silu_mul_triton`)."""
    if runs_triton(h):
        from .activation_triton import silu_mul_triton

        return silu_mul_triton(h, inner)
    return F.silu(h[:, :inner]) * h[:, inner : 2 * inner]
