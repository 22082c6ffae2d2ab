"""Sweep of the decode attention kernels' launch choices (key splits x keys a loop step x warps), CUDA graphs.

A batch-1 decode step of the 1B-class checkpoints spends more on attention than its few keys explain
(H200, 2026-12-06, 128-token prompts: kimi_linear's MLA kernel 30 us a call at batch 1 and at batch 64,
three calls a step, 16 keys a step: about 3 us a step; qwen3_next's GQA kernel 10 us at 64 keys a step, the
same per step): one program a row walks the keys in steps whose loads wait on the page table. For each batch
and context this times every combination (one decode token a row, `context` keys already in shuffled pages;
the merge of split partials included), and prints the best next to the default's choice. MLA also takes
`--stages` (the key loop's software pipelining; 0: Triton's default).

Shapes: `mla` kimi_linear 1B's (16 heads over a 512-wide latent + 64 rope), `gqa` qwen3_next 1B's (16 query /
2 kv heads of 256) and nemotron_h 1B's (32 / 8 of 128); bf16, pages of 16.

    PYTHONPATH=. python benchmarks/tune_decode_attention.py --batches 1 16 64 --contexts 160 1024
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/tune_decode_attention.py --device cpu --batches 1 \
        --contexts 40 --splits 1 2 --block-n 16 --warps 4 --iters 1          # a smoke test of the script
"""
from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.ops_attention import page_table_for
from benchmarks.ops_mamba2 import timed
from benchmarks.timing import graphed
from hybridcache.ops.attention._triton_flash import plan_grid
from hybridcache.ops.attention.triton_mla import BLOCK_N, MAX_TILE_ROWS, mla_attend_triton
from hybridcache.ops.attention.triton_paged import attend_kv_pages_triton

DTYPE, PAGE = torch.bfloat16, 16
GQA = {"gqa qwen3_next": (16, 2, 256), "gqa nemotron_h": (32, 8, 128)}  # query heads, kv heads, head dim
MLA_HEADS, RANK, ROPE = 16, 512, 64


def case(name: str, batch: int, context: int, device: str):
    """fn(num_splits, block_n, warps) running one call, and the default's split count."""
    table, num_pages = page_table_for(batch, context, PAGE, device)
    cached = torch.full((batch,), context - 1, dtype=torch.int32, device=device)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=device)
    if name == "mla":
        pages = torch.randn(num_pages, PAGE, RANK + ROPE, device=device, dtype=DTYPE)
        q_lat = torch.randn(batch, MLA_HEADS, RANK, device=device, dtype=DTYPE)
        q_rope = torch.randn(batch, MLA_HEADS, ROPE, device=device, dtype=DTYPE)
        default = plan_grid(batch, batch, table.shape[1], PAGE, MLA_HEADS, MAX_TILE_ROWS, 1, q_lat.device, None, None)

        def fn(splits, block_n, warps, stages=None):
            return mla_attend_triton(q_lat, q_rope, pages, table, cached, cu, 0.1, num_splits=splits,
                                     block_n=block_n, num_warps=warps, num_stages=stages)
        return fn, default[2]
    heads, kv_heads, dim = GQA[name]
    kv = torch.randn(num_pages, 2, PAGE, kv_heads, dim, device=device, dtype=DTYPE)
    q = torch.randn(batch, heads, dim, device=device, dtype=DTYPE)
    default = plan_grid(batch, batch, table.shape[1], PAGE, heads // kv_heads, 32, kv_heads, q.device, None, None)

    def fn(splits, block_n, warps, stages=None):  # warps, stages: the kernel's own choice (it takes none)
        return attend_kv_pages_triton(q, kv, table, cached, cu, num_splits=splits, block_n=block_n)
    return fn, default[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", nargs="+", default=["mla", *GQA])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--contexts", type=int, nargs="+", default=[160, 1024])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--block-n", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = args.device
    for name, batch, context in itertools.product(args.ops, args.batches, args.contexts):
        fn, default_splits = case(name, batch, context, device)
        warps, stages = (args.warps, args.stages) if name == "mla" else ([0], [0])
        times = {}
        for splits, block_n, w, st in itertools.product(args.splits, args.block_n, warps, stages):
            try:
                call = graphed(lambda: fn(splits, block_n, w or None, st or None), device, True)
                times[splits, block_n, w, st] = timed(call, device, args.iters) * 1e6
            except Exception as exc:  # noqa: BLE001 - a choice that does not compile (registers) is skipped
                print(f"  {name} B={batch} ctx={context} {splits}/{block_n}/{w}/{st}: {type(exc).__name__}")
        call = graphed(lambda: fn(None, BLOCK_N if name == "mla" else None, None), device, True)
        default = timed(call, device, args.iters) * 1e6
        best = min(times, key=times.get)
        row = "  ".join(f"{s}/{n}/{w}/{st}:{us:.1f}" for (s, n, w, st), us in sorted(times.items()))
        print(f"{name:15} B={batch:<3} ctx={context:<5} default ({default_splits} splits) {default:6.1f} us  "
              f"best splits={best[0]} block_n={best[1]} warps={best[2] or '-'} stages={best[3] or '-'} "
              f"{times[best]:6.1f} us ({default / times[best]:.2f}x) | splits/keys/warps/stages: {row}", flush=True)
        del fn
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
