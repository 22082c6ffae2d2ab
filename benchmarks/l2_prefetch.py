"""Whether a weight streamed into L2 ahead of its gemv (`ops/l2_prefetch_triton.py`) shortens a batch-1 decode
step's chain: groups of [S small dependent launches, then a gemv of a fresh [D, D] bf16 weight], N groups in one
CUDA graph, PDL on, with and without a bulk L2 prefetch of the group's weight launched before its small launches.
The small launches (rms_norm_triton of the row) stand for a step's norms, conv updates and recurrent decodes,
during which DRAM is otherwise idle; S = 0 puts the prefetch right before its gemv. Prints microseconds a group and
what the prefetch saves, measured in one run.

    PYTHONPATH=. python benchmarks/l2_prefetch.py --groups 32 --json l2_prefetch.json
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.launch_floor import replay_us
from benchmarks.ops_gdn import copy_bandwidth
from benchmarks.record import Record, add_json_arg
from hybridcache.ops.gemv_triton import gemv_triton
from hybridcache.ops.l2_prefetch_triton import l2_prefetch
from hybridcache.ops.rms_norm_triton import rms_norm_triton


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=32, help="groups a chain (N)")
    ap.add_argument("--hidden", type=int, default=2048, help="the row's width D")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4], help="the gemv weight's rows, in units of D")
    ap.add_argument("--small", type=int, nargs="+", default=[0, 1, 2, 4, 8], help="small launches a group (S)")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    add_json_arg(ap)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("l2_prefetch times CUDA graphs: it needs a GPU")
    n, d = args.groups, args.hidden
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(1, d, device=dev, generator=gen).to(torch.bfloat16)
    norm_w = torch.ones(d, device=dev, dtype=torch.bfloat16)
    copy_gbs = copy_bandwidth("cuda", 1 << 30)
    rec = Record(args.json, "l2_prefetch", "cuda", dict(groups=n, hidden=d, copy_gbs=copy_gbs))
    print(f"copy bandwidth (read + write) {copy_gbs:,.0f} GB/s; {n} groups a chain, D {d}; "
          f"{torch.cuda.get_device_name()}")
    print(f"{'weight MB':>9} {'S':>3} {'plain us':>9} {'prefetch us':>12} {'saved us':>9} {'small alone us':>15}")
    for rows in args.rows:
        weights = torch.randn(n, rows * d, d, device=dev, generator=gen).mul_(d ** -0.5).to(torch.bfloat16)
        mb = weights[0].numel() * 2 / 1e6
        for s in args.small:
            def group(i: int, y: torch.Tensor, prefetch: bool) -> torch.Tensor:
                if prefetch:
                    l2_prefetch(weights[i])
                for _ in range(s):
                    y = rms_norm_triton(y, norm_w, 1e-6)
                gemv_triton(y, weights[i])  # its output unused: PDL keeps the chain in stream order
                return y

            plain = replay_us(lambda i, y: group(i, y, False), x, n, args.replays, args.repeats)
            ahead = replay_us(lambda i, y: group(i, y, True), x, n, args.replays, args.repeats)
            alone = replay_us(lambda i, y: rms_norm_triton(y, norm_w, 1e-6), x, n, args.replays, args.repeats) * s
            print(f"{mb:>9.1f} {s:>3} {plain:>9.2f} {ahead:>12.2f} {plain - ahead:>9.2f} {alone:>15.2f}")
            rec.add(weight_mb=mb, small=s, plain_us=plain, prefetch_us=ahead, small_alone_us=alone)
    rec.close()


if __name__ == "__main__":
    main()
