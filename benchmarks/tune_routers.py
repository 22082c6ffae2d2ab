"""The fused routers at decode batch sizes with the one-token programs at each warp count
(`routers_triton.ONE_TOKEN_WARPS`; default: 8 where a program holds more than LOGIT_TILE of W, else 4), the
logits computed in the kernel, under CUDA graphs; qwen3_next's softmax router and kimi_linear's group router at
their 1B shapes (ops_moe.py's `router_case`), us a call.

    PYTHONPATH=. python benchmarks/tune_routers.py --batches 1 4 16 --warps 1 2 4 8
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.ops_moe import router_case
from hybridcache.ops.moe import routers_triton


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=["qwen3_next", "kimi_linear"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    torch.manual_seed(0)
    print("us a call: default launch | each warp count (torch's router for scale)")
    with torch.no_grad():
        for family in args.families:
            for n in args.batches:
                routers_triton.ONE_TOKEN_WARPS = None
                base = router_case(family, n, args.iters)
                cells = []
                for w in args.warps:
                    routers_triton.ONE_TOKEN_WARPS = w
                    cells.append(f"{w}: {router_case(family, n, args.iters)['fused_us']:6.1f}")
                routers_triton.ONE_TOKEN_WARPS = None
                print(f"{family:12} N={n:<3} {base['router']:18} default {base['fused_us']:6.1f} | "
                      + "  ".join(cells) + f" | torch {base['torch_us']:6.1f}", flush=True)


if __name__ == "__main__":
    main()
