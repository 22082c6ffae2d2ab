"""Sweep of the one-pair-a-program expert kernels' launch choices (rows a program x inner step x warps), each
kernel on its own with the other at its default, CUDA graphs.

At batch 1 these two launches are a MoE layer's experts (H200, 2026-12-06, qwen3_next 1B: up 11.5 us and down
6.5 us a layer against about 6 and 3 us of weight reads at the copy bandwidth; kimi_linear 1B: 5.8 and 4.4 us).
For each family and token count this times the whole call (router output given, the shared expert folded in as
the engine runs it) at every choice for one kernel, and prints the best next to the default (`_tiles`).

Shapes: the qwen3_next and kimi_linear 1B checkpoints (hidden 2048, 8 experts of 512, top 2; qwen3_next's
gated shared expert of 2048, kimi_linear's of 512), bf16.

    PYTHONPATH=. python benchmarks/tune_moe.py --tokens 1 2
"""
from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.families import FAMILIES
from benchmarks.ops_mamba2 import timed
from benchmarks.ops_moe import shapes
from benchmarks.timing import graphed
from hybridcache.ops.moe import MAX_PAIRS, SharedExpert, pairs
from hybridcache.ops.moe.experts_triton import fused_experts_triton

DEV, ACT = "cuda", torch.bfloat16


def case(family: str, n: int):
    """fn(up_launch, down_launch) running one call of the experts with the family's shared expert."""
    s, cfg = shapes(family), FAMILIES[family]["1b"]
    D, I, E, k = s["D"], s["I"], s["E"], s["k"]
    w = lambda *shape: (torch.randn(*shape, device=DEV) / shape[-1] ** 0.5).to(ACT)  # noqa: E731
    S = cfg["shared_expert_intermediate_size"] if family == "qwen3_next" else I * cfg["n_shared_experts"]
    shared = SharedExpert(w(S, D), w(D, S), w(S, D), w(D) if family == "qwen3_next" else None)
    up, down, gate = w(E, I, D), w(E, D, I), w(E, I, D)
    x = torch.randn(n, D, device=DEV).to(ACT)
    index = torch.stack([torch.randperm(E, device=DEV)[:k] for _ in range(n)])
    weight = torch.rand(n, k, device=DEV)
    assert pairs(index, I, shared) <= MAX_PAIRS, f"{n} tokens of {family}: past the pairs kernels' {MAX_PAIRS}"

    def fn(up_launch, down_launch):
        return fused_experts_triton(x, index, weight, up, down, gate, "silu", ACT, shared=shared,
                                    up_launch=up_launch, down_launch=down_launch)
    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=["qwen3_next", "kimi_linear"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--inner", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    for family, n in itertools.product(args.families, args.tokens):
        fn = case(family, n)
        default = timed(graphed(lambda: fn(None, None), DEV, True), DEV, args.iters) * 1e6
        for kernel in ("up", "down"):
            times = {}
            for choice in itertools.product(args.rows, args.inner, args.warps):
                launch = (choice, None) if kernel == "up" else (None, choice)
                try:
                    times[choice] = timed(graphed(lambda: fn(*launch), DEV, True), DEV, args.iters) * 1e6
                except Exception as exc:  # noqa: BLE001 - a choice that does not compile (registers) is skipped
                    print(f"  {family} N={n} {kernel} {choice}: {type(exc).__name__}")
            best = min(times, key=times.get)
            row = "  ".join(f"{r}/{i}/{w}:{t:.1f}" for (r, i, w), t in sorted(times.items()))
            print(f"{family:12} N={n:<3} {kernel:4} default {default:6.1f} us  best rows={best[0]} inner={best[1]} "
                  f"warps={best[2]} {times[best]:6.1f} us ({default / times[best]:.2f}x) | {row}", flush=True)


if __name__ == "__main__":
    main()
