"""The model's GEMMs, `x @ weight.T (+ bias)` (torch's: cuBLAS on CUDA), in one place, and the activations
that follow a GEMM where one launch on its output replaces torch's two or three: relu(y)², and silu(gate) * up
over one gate/up GEMM's halves.

A one-launch skinny Triton GEMM with these activations (and the mixers' conv update) in its epilogue lost to cuBLAS
in the engine on an H100 (nemotron_h 1b graph step 1.13 vs 1.02 ms at batch 1, 1.85 vs 1.35 ms at batch 16) and was
removed; it is in the history at commits 42922fe and b7b5b70. Up to GEMV_ROWS rows (0: none) take `gemv_triton` (no
tensor cores, one launch) where Triton runs, and one row does: batch-1 graph steps on an H100, back to back
(benchmarks/gpu/gemv_steps.sh), gave nemotron_h 1,195 tok/s against cuBLAS's 1,024, qwen3_next 1,198 against 1,122
and kimi_linear 1,414 against 1,424; at 2 and 4 rows cuBLAS is faster on most shapes (benchmarks/gpu/gemv.sh).

Folding the small launches around a one-row GEMM into the gemv (every program recomputing them from the whole row
as it loads it) cut the launches but slowed the step, and was removed (history: 6aaa5b2). H100, batch-1 graph
steps, replay ms (tok/s), all three folds off against on, back to back: nemotron_h 0.77 (1,225) against 1.05 (918),
147 -> 96 launches; qwen3_next 0.78 (1,196) against 0.95 (998), 135 -> 102; kimi_linear 0.68 (1,371) with them
on, 116 launches (its run with them off hit its time cap). The folds: a block's residual add + RMSNorm into its
first GEMM or its mixture's router, the MLP activation into the down projection (alone: nemotron_h 0.77 against
0.81 ms, 147 -> 135 launches), and a mixer's gated norm into its output projection.

Nor did epilogues on the one-row gemv pay, though they recompute nothing (session 45, history b5a9cc0): each
recurrent mixer's causal conv update on its input projection's conv columns (the windows loaded before the weight
loop) and nemotron_h's relu² on its up projection, bit for bit the separate launches. H100, batch-1 graph steps
off against on, back to back (benchmarks/gpu/gemv_steps.sh): replay ms 0.78 against 0.80 (nemotron_h, 147 -> 123
launches; its gemvs' GPU time 0.676 -> 0.752 ms, where the conv and relu² kernels had taken 0.055 + 0.050), 0.79
against 0.80 (qwen3_next, 135 -> 126), 0.60 against 0.61 (kimi_linear, 150 -> 141); tok/s 1,232 / 1,213 / 1,562
against 974 / 1,206 / 1,557 (nemotron_h's run with them on spent 22% of its 1.03 ms wall on the host, against 4%).

Nor did loading a weight's first two [4, 1,024] blocks before the gemv's PDL wait (a parameter no kernel of the step
writes, so they could stream in while the kernels before it finish; session 46, history 7e3dc2d): H100, batch-1
graph steps, replay ms without against with, back to back (gemv_steps.sh with MODULE=gemv_triton): kimi_linear 0.60
against 0.59, nemotron_h 0.77 against 0.77. Nor did prefetching each program's whole weight rows into L2 there
(prefetch.global.L2, no registers held; session 48, history 4f78000), alone or with pdl_triton's early release
(history 74535d0): H100, tok/s without / with / with both, kimi_linear 1,589 / 1,546 / 1,489, qwen3_next 1,232 /
1,185 / 1,129, nemotron_h 1,241 / 1,119 / 1,119. Nor did the gemv's loop in Triton's software pipeline (STAGES: the
weight loads as cp.async into shared memory, 2 steps ahead at 3 stages; session 47, history c823c12): H100, tok/s
1 / 3 stages, kimi_linear 1,579 / 1,433, qwen3_next 1,230 / 1,092, nemotron_h 1,243 / 1,031.

Nor did asking L2 for a mixer's or MLP's output weight right after its one-row input projection, so that DRAM would
stream it while the conv, recurrent decode and norm launches run (session 52, history 6cc87dc and c45b780: one more
launch of `cp.async.bulk.prefetch.L2` bulk prefetches, issued before its PDL wait, at most 16 MiB of the weight).
H100, benchmarks/l2_prefetch.py (in the same history): groups of S one-row norms then a gemv of a fresh 8.4 MB
weight, us a group without / with the prefetch launched first, S = 0 / 2 / 4: 5.2 / 6.4 / 8.5 against 11.4 / 13.9 /
15.9 at 2 KiB a bulk prefetch over 128 one-warp programs, and 34.4 / 36.9 / 39.0 at 64 KiB a thread from one 4-warp
program. In the batch-1 graph step (gemv_steps.sh) kimi_linear ran 1,495 tok/s against 1,587 without (the 13
prefetch launches 0.078 ms of GPU time a step, PDL waits included, while its gemvs' time stayed 0.317 ms: the weights
were not read from L2 any faster); at 64 KiB, kimi_linear 971 against 1,580 and qwen3_next 823 against 1,224. A
prefetch on a forked stream of the graph, off the PDL chain, did not pay either (session 53,
benchmarks/launch_floor.py's gemv-side-A chains: after each gemv of a chain of 64, a second stream forks and asks L2
for the weight A launches ahead): H100, us a launch with PDL, gemv 5.08, its weight already in L2 3.94, with the
side prefetch 6.69 / 6.59 / 6.58 at A = 1 / 2 / 4 (without PDL 4.86, 3.11, and 5.33 / 4.99 / 6.55).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .triton_support import runs_triton

GEMV_ROWS = 1
# MLA's absorbed key and value products at one query row (cuBLAS's batched GEMMs, nvjet kernels at about 14% of the
# copy bandwidth in the batch-1 step, H100: benchmarks/gpu/bs1_kernels.sh) as `gemv_triton`'s batched launch, under
# the same GEMV_ROWS rule. Off until timed: `FAMILIES=kimi_linear SETTING=BATCHED_GEMV VALUES="False True" bash
# benchmarks/gpu/gemv_steps.sh`
BATCHED_GEMV = False


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    """x [M, K], weight [N, K], bias [N] or None -> [M, N] in x's dtype; with `out_dtype` float32, that result as
    float32 (the gemv widens it in its own launch, not a cast's)."""
    if x.dim() == 2 and 0 < x.shape[0] <= GEMV_ROWS and runs_triton(x):
        from .gemv_triton import gemv_triton

        return gemv_triton(x, weight, bias, out_dtype=out_dtype)
    y = F.linear(x, weight, bias)
    return y if out_dtype is None else y.to(out_dtype)


def batched_linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [B, M, K], weight [B, N, K] (any strides) -> [B, M, N] in x's dtype, each batch entry's `x @ weight.T`:
    torch.bmm, or where BATCHED_GEMV and Triton runs up to GEMV_ROWS rows, `gemv_triton.bmm_rows_triton`."""
    if BATCHED_GEMV and 0 < x.shape[1] <= GEMV_ROWS and runs_triton(x):
        from .gemv_triton import bmm_rows_triton

        return bmm_rows_triton(x, weight)
    return torch.bmm(x, weight.transpose(1, 2))


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
