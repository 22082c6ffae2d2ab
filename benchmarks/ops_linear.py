"""The model's decode GEMMs on the GPU at the 1B-class checkpoints' shapes, through the cuBLAS entries torch
offers for a few rows: `F.linear` (what `ops/linear.py` calls: cuBLASLt, which picks split-K plus a reduce kernel
for nemotron_h's 2,048-row outputs over 4,096 and 5,120 columns at one row: 27 of each a bs1 step, 9.3 us a pair
on the H200), `torch.mv` (a matrix-vector product, one row only) and `weight @ x.T` (the transposed problem),
and our `gemv_triton` up to its MAX_ROWS rows; bf16, GB/s of the weight read once, against the measured copy
bandwidth. What would change `ops/linear.py`. `--sweep` also times gemv_triton at each tiling of --block-n x
--block-k x --warps and prints the best per shape and row count.

    PYTHONPATH=. python benchmarks/ops_linear.py --rows 1 4 16 --json bench-out/ops_linear.json

Each figure is the median of 5 timed runs of `iters` CUDA-graph replays after warm-up (CUDA events). A replay
calls the op once on each of `--copies` copies of the weight (default: enough for 2 x 50 MB, past an H100's
or H200's L2), and a call's time is the replay's over the copies: inside a decode step the weights of the
layers in between have left L2, and a weight timed alone, call after call, would be read from L2 (faster than
the copy bandwidth).
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

from benchmarks.ops_mamba2 import copy_bandwidth, timed
from benchmarks.record import Record, add_json_arg
from benchmarks.timing import graphed
from hybridcache.ops.gemv_triton import MAX_ROWS, gemv_triton

DEV, ACT = "cuda", torch.bfloat16
PAST_L2 = 100 * 2 ** 20  # bytes of weight copies a replay walks through (2 x 50 MB)
# (GEMM, output rows N, input width K)
SHAPES = [
    ("nemotron_h mamba in_proj", 10304, 2048), ("nemotron_h mamba out_proj", 2048, 4096),
    ("nemotron_h mlp up", 5120, 2048), ("nemotron_h mlp down", 2048, 5120), ("nemotron_h attention qkv", 6144, 2048),
    ("qwen3_next gdn in_proj", 12352, 2048), ("qwen3_next attention q/k/v", 9216, 2048),
    ("kimi_linear kda in_proj", 6416, 2048), ("kimi_linear kda low-rank up", 4096, 256),
    ("kimi_linear kda o_proj", 2048, 2048), ("lm head", 32000, 2048),
]


def paths(x: torch.Tensor) -> dict:
    """name -> fn(weight [N, K]) -> x @ weight.T [rows, N]."""
    out = {"F.linear": lambda w: F.linear(x, w), "w @ x.T": lambda w: (w @ x.T).T}
    if x.shape[0] == 1:
        out["torch.mv"] = lambda w: torch.mv(w, x[0])[None]
    if x.shape[0] <= MAX_ROWS:
        out["triton gemv"] = lambda w: gemv_triton(x, w)
    return out


def per_call_us(fn, weights: list[torch.Tensor], iters: int) -> float:
    """us a call of fn(weight), a graph replay calling it on each of `weights` in turn."""
    replay = graphed(lambda: [fn(w) for w in weights], DEV, True)
    return timed(replay, DEV, iters) * 1e6 / len(weights)


def sweep(x: torch.Tensor, weights: list[torch.Tensor], args) -> str:
    """gemv_triton at each tiling: the best, and every tiling's us."""
    times = {}
    for bn, bk, w in itertools.product(args.block_n, args.block_k, args.warps):
        times[bn, bk, w] = per_call_us(lambda wt: gemv_triton(x, wt, block_n=bn, block_k=bk, num_warps=w), weights,
                                       args.iters)
    best = min(times, key=times.get)
    cells = " ".join(f"{bn}/{bk}/{w}:{us:.1f}" for (bn, bk, w), us in times.items())
    return f"best {best[0]}/{best[1]}/{best[2]} {times[best]:.1f} us | {cells}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--sweep", action="store_true", help="gemv_triton's tilings too (block_n/block_k/warps)")
    ap.add_argument("--block-n", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--block-k", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--copies", type=int, help="weight copies a replay walks through (default: past L2)")
    add_json_arg(ap)
    args = ap.parse_args()
    torch.manual_seed(0)
    bandwidth = copy_bandwidth(DEV)
    record = Record(args.json, "ops_linear", DEV, dict(iters=args.iters, rows=args.rows, copies=args.copies))
    record.extra("copy_gbs", bandwidth)
    print(f"copy bandwidth {bandwidth:.0f} GB/s; us (GB/s of the weight) per path")
    with torch.no_grad():
        for name, N, K in SHAPES:
            weight = (torch.randn(N, K, device=DEV) / K ** 0.5).to(ACT)
            weight_bytes = weight.numel() * weight.element_size()
            weights = [weight] + [weight.clone() for _ in range((args.copies or -(-PAST_L2 // weight_bytes)) - 1)]
            for rows in args.rows:
                x = torch.randn(rows, K, device=DEV).to(ACT)
                row = dict(gemm=name, N=N, K=K, rows=rows, copies=len(weights),
                           roofline_us=weight_bytes / bandwidth / 1e3)
                timings = {path: (fn, F.linear(x, weight)) for path, fn in paths(x).items()}
                for path, (fn, want) in timings.items():
                    err = (fn(weight).float() - want.float()).abs().max().item()
                    assert err <= 0.05 * want.float().abs().max().item(), f"{path} disagrees by {err}"
                    row[f"{path}_us"] = per_call_us(fn, weights, args.iters)
                record.add(**row)
                cells = "  ".join(f"{p} {row[f'{p}_us']:6.1f} ({weight_bytes / row[f'{p}_us'] / 1e3:5.0f})"
                                  for p in timings)
                print(f"{name:28} M={rows:<3} roof {row['roofline_us']:5.1f} | {cells}", flush=True)
                if args.sweep and rows <= MAX_ROWS:
                    print(f"  gemv_triton tilings (block_n/block_k/warps): {sweep(x, weights, args)}", flush=True)
    record.close()


if __name__ == "__main__":
    main()
