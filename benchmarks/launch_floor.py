"""What a launch costs inside a batch-1 decode step's CUDA graph beyond its bytes: chains of N dependent launches
captured in one graph, replayed, timed per launch, with programmatic dependent launch (PDL) on and off.

    empty        a Triton kernel that only takes PDL's wait and returns (no loads)
    norm         rms_norm_triton of a [1, D] row, each launch normalising the one before's output
    gemv         gemv_triton of a [1, D] row by a [D, D] bf16 weight, a fresh weight each launch (the chain's
                 weights pass L2 many times over), each launch's row the one before's output
    gemv-merged  the same weights as one [N·D, D] weight: one launch reads the chain's bytes, no chain
    gemv-l2      the gemv chain on one weight, every launch reading it again (8.4 MB: from L2 after the first)

`gemv` minus `gemv-merged` a launch is what the chain adds to a weight read: what a step of N such launches would
save as one kernel; `gemv` minus `gemv-l2`, what a launch would save if its weight were in L2 before it starts (the
most any prefetch ahead of it could give). A batch-1 decode step of a 1B-class checkpoint is 120 to 150 launches,
about a third of them gemvs of this size (benchmarks/gpu/bs1_kernels.sh gives them per kernel name).

    PYTHONPATH=. python benchmarks/launch_floor.py --launches 64 --json launch_floor.json
"""
from __future__ import annotations

import argparse
import torch
import triton
import triton.language as tl

from benchmarks.ops_gdn import copy_bandwidth
from benchmarks.ops_mamba2 import timed
from benchmarks.record import Record, add_json_arg
from hybridcache.ops import pdl_triton
from hybridcache.ops.gemv_triton import gemv_triton
from hybridcache.ops.pdl_triton import pdl_entry, pdl_launch
from hybridcache.ops.rms_norm_triton import rms_norm_triton


@triton.jit
def _empty_kernel(x_ptr, PDL: tl.constexpr):
    pdl_entry(PDL)


def empty(x: torch.Tensor) -> torch.Tensor:
    _empty_kernel[(1,)](x, **pdl_launch(x))
    return x


def replay_us(chain, x: torch.Tensor, launches: int, replays: int, repeats: int) -> float:
    """Microseconds a launch of `chain(i, x) -> x` captured `launches` times into one graph: the median of
    `repeats` timings of `replays` back-to-back replays."""
    def body():
        y = x
        for i in range(launches):
            y = chain(i, y)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()  # compiles the kernels before the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return timed(graph.replay, "cuda", replays, repeats) * 1e6 / launches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=64, help="launches a chain (N)")
    ap.add_argument("--hidden", type=int, default=2048, help="the row's width D")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    add_json_arg(ap)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("launch_floor times CUDA graphs: it needs a GPU")
    n, d = args.launches, args.hidden
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(1, d, device=dev, generator=gen).to(torch.bfloat16)
    norm_w = torch.ones(d, device=dev, dtype=torch.bfloat16)
    weights = torch.randn(n * d, d, device=dev, generator=gen).mul_(d ** -0.5).to(torch.bfloat16)
    parts = weights.view(n, d, d)
    gemv_bytes = d * d * 2
    copy_gbs = copy_bandwidth("cuda", 1 << 30)
    rec = Record(args.json, "launch_floor", "cuda", dict(launches=n, hidden=d, copy_gbs=copy_gbs))
    chains = {
        "empty": (lambda i, y: empty(y), 0),
        "norm": (lambda i, y: rms_norm_triton(y, norm_w, 1e-6), 4 * d),
        "gemv": (lambda i, y: gemv_triton(y, parts[i]), gemv_bytes),
        "gemv-l2": (lambda i, y: gemv_triton(y, parts[0]), gemv_bytes),
    }
    print(f"copy bandwidth (read + write) {copy_gbs:,.0f} GB/s; {n} launches a chain, D {d}; a gemv reads "
          f"{gemv_bytes / 1e6:.1f} MB, {gemv_bytes / copy_gbs / 1e3:.2f} us of it")
    print(f"{'chain':>12} {'PDL':>5} {'us a launch':>12} {'GB/s':>7}")
    for pdl in (True, False):
        pdl_triton.ENABLED = pdl
        results = {}
        for name, (chain, nbytes) in chains.items():
            results[name] = replay_us(chain, x, n, args.replays, args.repeats)
        merged = replay_us(lambda i, y: gemv_triton(y, weights), x, 1, args.replays, args.repeats) / n
        results["gemv-merged"] = merged
        for name, us in results.items():
            nbytes = chains[name][1] if name in chains else gemv_bytes
            gbs = nbytes / us / 1e3 if nbytes else 0.0
            print(f"{name:>12} {str(pdl):>5} {us:>12.2f} {gbs:>7,.0f}")
            rec.add(chain=name, pdl=pdl, us_per_launch=us, bytes_per_launch=nbytes, gbs=gbs)
        print(f"{'gemv chain adds':>12} {str(pdl):>5} {results['gemv'] - merged:>12.2f} us a launch over one "
              f"merged read")
    pdl_triton.ENABLED = True
    rec.close()


if __name__ == "__main__":
    main()
