"""The model's decode GEMMs on the GPU: the skinny Triton kernel (`ops/skinny_linear_triton.py`, one launch
with its activation) against cuBLAS (`F.linear`, then the activation's own Triton launch), at the 1B-class
checkpoints' shapes (benchmarks/families.py) and 1, 4 and 16 rows, bf16; GB/s of the weight read once,
against the measured copy bandwidth. What decides `ops/linear.py`'s SKINNY (off until this says so).

    PYTHONPATH=. python benchmarks/ops_linear.py --json bench-out/ops_linear.json [--sweep]

Each figure is the median of 5 timed runs of `iters` CUDA-graph replays after warm-up (CUDA events).
`--sweep` also times the skinny kernel's (BLOCK_N, BLOCK_K) tiles at each shape.
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.ops_mamba2 import copy_bandwidth, timed
from benchmarks.record import Record, add_json_arg
from benchmarks.timing import graphed
from hybridcache.ops import linear as dispatch
from hybridcache.ops.skinny_linear_triton import blocks, skinny_linear_triton
from hybridcache.ops.triton_support import num_sms

DEV = "cuda"
ACT = torch.bfloat16
ROWS = (1, 4, 16)
# (GEMM, output rows N (the gate/up pair's inner for silu_mul), input width K, epilogue)
SHAPES = [
    ("nemotron_h mamba in_proj", 10304, 2048, "none"), ("nemotron_h mamba out_proj", 2048, 4096, "none"),
    ("nemotron_h mlp up", 5120, 2048, "relu2"), ("nemotron_h mlp down", 2048, 5120, "none"),
    ("nemotron_h attention qkv", 6144, 2048, "none"),
    ("qwen3_next gdn in_proj", 12352, 2048, "none"), ("qwen3_next attention q/k/v", 9216, 2048, "none"),
    ("kimi_linear kda in_proj", 6416, 2048, "none"), ("kimi_linear kda low-rank up", 4096, 256, "none"),
    ("kimi_linear kda o_proj", 2048, 2048, "none"), ("kimi_linear dense gate/up", 5120, 2048, "silu_mul"),
    ("lm head", 32000, 2048, "none"),
]
SWEEP = [(n, k) for n in (16, 32, 64) for k in (64, 128, 256)]


def case(name: str, N: int, K: int, epilogue: str, rows: int, bandwidth: float, iters: int, sweep: bool) -> dict:
    gated = epilogue == "silu_mul"
    weight = (torch.randn(2 * N if gated else N, K, device=DEV) / K ** 0.5).to(ACT)
    x = torch.randn(rows, K, device=DEV).to(ACT)
    inner = N if gated else None
    weight_bytes = weight.numel() * weight.element_size()
    row = dict(gemm=name, N=N, K=K, epilogue=epilogue, rows=rows, weight_bytes=weight_bytes,
               roofline_us=weight_bytes / bandwidth / 1e3,
               tiles="x".join(map(str, blocks(rows, N, K, num_sms(x.device)))))
    real = dispatch.SKINNY
    try:
        for path, on in (("cublas", False), ("skinny", True)):
            dispatch.SKINNY = on
            row[f"{path}_us"] = timed(graphed(lambda: dispatch.linear(x, weight, None, epilogue, inner), DEV, True),
                                      DEV, iters) * 1e6
            row[f"{path}_GBps"] = weight_bytes / (row[f"{path}_us"] * 1e-6) / 1e9
    finally:
        dispatch.SKINNY = real
    if sweep:
        bm = blocks(rows, N, K, num_sms(x.device))[0]
        row["sweep_us"] = {f"{bn}x{bk}": timed(graphed(lambda: skinny_linear_triton(
            x, weight, None, epilogue, inner, block=(bm, bn, bk)), DEV, True), DEV, iters) * 1e6 for bn, bk in SWEEP}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--sweep", action="store_true", help="the skinny kernel's BLOCK_N x BLOCK_K tiles too")
    add_json_arg(ap)
    args = ap.parse_args()
    torch.manual_seed(0)
    bandwidth = copy_bandwidth(DEV)
    record = Record(args.json, "ops_linear", DEV, dict(iters=args.iters, rows=args.rows))
    record.extra("copy_gbs", bandwidth)
    print(f"copy bandwidth {bandwidth:.0f} GB/s")
    print(f"{'GEMM':28} {'epilogue':>8} {'M':>3} {'roof us':>8} {'cuBLAS us':>10} {'GB/s':>6} {'skinny us':>10} "
          f"{'GB/s':>6} {'ratio':>6} {'tiles':>10}")
    with torch.no_grad():
        for name, N, K, epilogue in SHAPES:
            for rows in args.rows:
                r = case(name, N, K, epilogue, rows, bandwidth, args.iters, args.sweep)
                record.add(**r)
                print(f"{name:28} {epilogue:>8} {rows:>3} {r['roofline_us']:>8.1f} {r['cublas_us']:>10.1f} "
                      f"{r['cublas_GBps']:>6.0f} {r['skinny_us']:>10.1f} {r['skinny_GBps']:>6.0f} "
                      f"{r['cublas_us'] / r['skinny_us']:>5.2f}x {r['tiles']:>10}")
                if args.sweep:
                    print("    tiles (BLOCK_N x BLOCK_K: us): " + " ".join(f"{t} {v:.1f}" for t, v in r["sweep_us"].items()))
    record.close()


if __name__ == "__main__":
    main()
