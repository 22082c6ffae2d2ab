"""Routed experts and routers of one MoE layer on the GPU at decode and verify batch sizes: the Triton
paths (`ops/moe`: one program a pair, 2 launches; the pairs sorted by expert, 4 launches, the sort kernel
also timed alone; 1 launch for the router's selection) vs the grouped-GEMM path (`dispatch` with
`torch._grouped_mm`: sort, gather, 3 grouped GEMMs, act, mul, index_add) and the torch routers, against
the roofline of reading the routed experts' weights once; and the whole MoE layer with its shared expert
run inside the experts' kernels against on its own. Every path is timed at every batch, past the
limits the forwards use (MAX_PAIRS, MAX_SORTED_PAIRS), to place them; `--sweep` also times the sorted
kernels' pair, column and inner tiles and warps.

Shapes: the qwen3_next and kimi_linear 1B checkpoints of benchmarks/families.py (hidden 2048, 8 experts of
512, top 2; qwen3_next's softmax router, kimi_linear's sigmoid group router with n_group 1), bf16.
Weight bytes = the distinct experts the batch routes to x 3 matrices x I x D x 2 B (what a path that reads
each chosen expert once must read); GB/s = those bytes / the time; roofline_us = bytes / the measured
device copy bandwidth.

    PYTHONPATH=. python benchmarks/ops_moe.py --json bench-out/ops_moe.json

Each figure is the median of 5 timed runs of `iters` CUDA-graph replays after warm-up (CUDA events).
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.families import FAMILIES
from benchmarks.ops_mamba2 import copy_bandwidth, timed
from benchmarks.record import Record, add_json_arg
from benchmarks.timing import graphed
from hybridcache.models.layers import experts as experts_layer
from hybridcache.models.layers import routers as routers_layer
from hybridcache.models.layers.experts import GatedExperts
from hybridcache.models.layers.kimi_moe import KimiMoE
from hybridcache.models.layers.routers import SoftmaxTopKRouter, TopKRouter
from hybridcache.models.layers.shared_moe import SharedExpertMoE
from hybridcache.ops.moe import MAX_PAIRS, MAX_SORTED_PAIRS
from hybridcache.ops.moe.experts_sorted_triton import _tiles, sort_pairs_triton, sorted_experts_triton
from hybridcache.ops.moe.experts_triton import fused_experts_triton

DEV = "cuda"
ACT = torch.bfloat16
BATCHES = (1, 4, 16, 32, 64, 128, 256, 512)
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps)
SWEEP = [(m, n, k, w) for m in (16, 32, 64) for n in (16, 32, 64) for k in (64, 128) for w in (4, 8)]


def shapes(family: str) -> dict:
    cfg = FAMILIES[family]["1b"]
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    return dict(D=cfg["hidden_size"], I=cfg["moe_intermediate_size"], E=experts, k=cfg["num_experts_per_tok"],
                n_group=cfg.get("n_group", 1), topk_group=cfg.get("topk_group", 1))


def fill(module: torch.nn.Module) -> torch.nn.Module:
    for p in module.parameters():
        p.copy_((torch.randn(p.shape, device=DEV) / p.shape[-1] ** 0.5).to(p.dtype))
    return module


def us(fn, iters: int) -> float:
    return timed(graphed(fn, DEV, True), DEV, iters) * 1e6


def fused_path(on: bool):
    """A stand-in for a layer module's `runs_triton`: the fused kernels on CUDA tensors (on) or never."""
    def forced(t: torch.Tensor) -> bool:
        return on and t.is_cuda
    return forced


def experts_case(family: str, n: int, bandwidth: float, iters: int, sweep: bool) -> dict:
    s = shapes(family)
    module = fill(GatedExperts(s["E"], s["D"], s["I"], "silu", DEV, ACT))
    x = torch.randn(n, s["D"], device=DEV).to(ACT)
    index = torch.stack([torch.randperm(s["E"], device=DEV)[:s["k"]] for _ in range(n)])
    weight = torch.rand(n, s["k"], device=DEV).to(ACT if family == "qwen3_next" else torch.float32)
    distinct = int(index.unique().numel())
    weight_bytes = distinct * 3 * s["I"] * s["D"] * module.up.element_size()
    row = dict(family=family, batch=n, pairs=n * s["k"], distinct_experts=distinct, weight_bytes=weight_bytes,
               roofline_us=weight_bytes / bandwidth / 1e3)
    args = (module.up, module.down, module.gate, "silu", ACT)

    def sorted_path(tiles=None, warps=4):
        order, ends = sort_pairs_triton(index, s["E"])
        return sorted_experts_triton(x, index, weight, order, ends, *args, tiles=tiles, num_warps=warps)

    paths = {"pairs": lambda: fused_experts_triton(x, index, weight, *args), "sorted": sorted_path,
             "grouped": lambda: module(x, index, weight), "sort": lambda: sort_pairs_triton(index, s["E"])}
    real = experts_layer.runs_triton
    try:
        experts_layer.runs_triton = fused_path(False)  # the module's forward: the grouped path
        for name, fn in paths.items():
            row[f"{name}_us"] = us(fn, iters)
            row[f"{name}_GBps"] = weight_bytes / (row[f"{name}_us"] * 1e-6) / 1e9
        if sweep:
            row["sorted_tiles"] = "x".join(map(str, _tiles(n * s["k"], s["E"], s["I"], s["D"], x.device)))
            row["sweep_us"] = {f"{bm}x{bn}x{bk}/{w}": us(lambda: sorted_path((bm, bn, bk), w), iters)
                               for bm, bn, bk, w in SWEEP}
    finally:
        experts_layer.runs_triton = real
    return row


def router_case(family: str, n: int, iters: int) -> dict:
    s = shapes(family)
    if family == "qwen3_next":
        module = fill(SoftmaxTopKRouter(s["D"], s["E"], s["k"], True, DEV, ACT))
    else:
        module = fill(TopKRouter(s["D"], s["E"], s["k"], s["n_group"], s["topk_group"], True, 2.446, DEV))
    x = torch.randn(n, s["D"], device=DEV).to(ACT)
    row = dict(family=family, batch=n, router=type(module).__name__)
    real = routers_layer.runs_triton
    try:
        for name, on in (("fused", True), ("torch", False)):
            routers_layer.runs_triton = fused_path(on)
            row[f"{name}_us"] = us(lambda: module(x), iters)
    finally:
        routers_layer.runs_triton = real
    return row


def shared_case(family: str, n: int, iters: int) -> dict:
    """One MoE layer's forward (router, experts, shared expert): the shared expert inside the experts' kernels
    (wherever `GatedExperts.takes_shared`; the layers' choice, `folds_shared`, follows these timings) against on its
    own (gate/up GEMM, silu * up, down GEMM, and qwen3_next's gated sum; `folds_shared` answering no)."""
    s, cfg = shapes(family), FAMILIES[family]["1b"]
    if family == "qwen3_next":
        module = SharedExpertMoE(s["D"], s["E"], s["k"], s["I"], cfg["shared_expert_intermediate_size"], "silu",
                                 True, DEV, ACT)
    else:
        module = KimiMoE(s["D"], s["E"], s["k"], s["I"], cfg["n_shared_experts"], "silu", s["n_group"],
                         s["topk_group"], True, 2.446, DEV, ACT)
    fill(module)
    x = torch.randn(n, s["D"], device=DEV).to(ACT)
    shared = module.shared_expert if family == "qwen3_next" else module.shared_experts
    row = dict(family=family, batch=n, shared_inner=shared.inner)
    folds = GatedExperts.folds_shared
    try:
        for name, fold in (("folded", True), ("separate", False)):
            GatedExperts.folds_shared = GatedExperts.takes_shared if fold else (lambda *a: False)
            row[f"{name}_us"] = us(lambda: module(x), iters)
    finally:
        GatedExperts.folds_shared = folds
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--families", nargs="+", default=["qwen3_next", "kimi_linear"])
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--sweep", action="store_true",
                    help="the sorted kernels' tiles and warps too (BLOCK_M x BLOCK_N x BLOCK_K / warps)")
    add_json_arg(ap)
    args = ap.parse_args()
    torch.manual_seed(0)
    bandwidth = copy_bandwidth(DEV)
    record = Record(args.json, "ops_moe", DEV, dict(iters=args.iters, batches=args.batches, max_pairs=MAX_PAIRS,
                                                   max_sorted_pairs=MAX_SORTED_PAIRS))
    record.extra("copy_gbs", bandwidth)
    print(f"copy bandwidth {bandwidth:.0f} GB/s")
    print(f"limits: pairs up to {MAX_PAIRS}, sorted up to {MAX_SORTED_PAIRS}, grouped above")
    print(f"{'family':12} {'N':>3} {'pairs':>5} {'experts':>7} {'roof us':>8} {'pairs us':>9} {'GB/s':>6} "
          f"{'sorted us':>9} {'GB/s':>6} {'grouped us':>10} {'GB/s':>6}")
    with torch.no_grad():
        for family in args.families:
            for n in args.batches:
                r = experts_case(family, n, bandwidth, args.iters, args.sweep)
                record.add(kind="experts", **r)
                print(f"{family:12} {n:>3} {r['pairs']:>5} {r['distinct_experts']:>7} {r['roofline_us']:>8.1f} "
                      f"{r['pairs_us']:>9.1f} {r['pairs_GBps']:>6.0f} {r['sorted_us']:>9.1f} {r['sorted_GBps']:>6.0f} "
                      f"{r['grouped_us']:>10.1f} {r['grouped_GBps']:>6.0f} {r['sort_us']:>9.1f}")
                if args.sweep:
                    print(f"    sorted tiles (BLOCK_M x BLOCK_N x BLOCK_K / warps: us; default "
                          f"{r['sorted_tiles']}/4): " +
                          " ".join(f"{t} {v:.1f}" for t, v in r["sweep_us"].items()))
        print(f"{'family':12} {'N':>3} {'router':18} {'fused us':>9} {'torch us':>9}")
        for family, n, r in recorded(record, "router", router_case, args):
            print(f"{family:12} {n:>3} {r['router']:18} {r['fused_us']:>9.1f} {r['torch_us']:>9.1f}")
        print(f"{'family':12} {'N':>3} {'shared I':>8} {'folded us':>10} {'separate us':>11}  (the whole MoE layer)")
        for family, n, r in recorded(record, "shared", shared_case, args):
            print(f"{family:12} {n:>3} {r['shared_inner']:>8} {r['folded_us']:>10.1f} {r['separate_us']:>11.1f}")
    record.close()


def recorded(record: Record, kind: str, case, args):
    """(family, tokens, row) of `case` over the families and batches, each row recorded as `kind`."""
    for family in args.families:
        for n in args.batches:
            row = case(family, n, args.iters)
            record.add(kind=kind, **row)
            yield family, n, row


if __name__ == "__main__":
    main()
