"""A GDN or KDA layer's plain decode between its projections: the one launch (`delta_rule_mixer_triton`: conv
update, recurrence, gated norm) against the three it replaces (conv update, decode with the raw gate, gated
norm), side by side in one run. Shapes of the 1B-class checkpoints: qwen3_next's GDN (16 key / 32 value
heads of 128), kimi_linear's KDA (16 heads of 128); conv kernel 4; bf16 activations, fp32 states.

Each variant is captured in one CUDA graph of --chain back-to-back calls (a decode step's layers follow each
other the same way, under PDL where the GPU has it) and timed as the median of --repeats graph replays; the
figure is microseconds a call. CUDA only (the interpreter's times mean nothing).

    PYTHONPATH=. python benchmarks/ops_mixer_decode.py --batches 1 16 64 256 --json out.json
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.record import Record, add_json_arg
from benchmarks.timing import graphed, median, time_runs
from hybridcache.ops.conv1d.triton_conv import causal_conv1d_update_triton
from hybridcache.ops.delta_rule_mixer_triton import delta_rule_mixer_decode_triton
from hybridcache.ops.delta_rule_triton import delta_rule_decode_triton
from hybridcache.ops.gdn import RawGate
from hybridcache.ops.kda import KDARawGate
from hybridcache.ops.rms_norm_triton import gated_rms_norm_triton, sigmoid_gated_rms_norm_triton

SHAPES = {"gdn": (16, 32, 128), "kda": (16, 16, 128)}  # H, HV, K = V
WIDTH, EPS = 4, 1e-6


def variants(family: str, B: int, dev: str):
    """(one launch, three launches): callables running one layer's decode of B rows on shared pools."""
    H, HV, K = SHAPES[family]
    C, bf = 2 * H * K + HV * K, torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(B)
    rand = lambda *shape, dtype=bf: torch.randn(*shape, device=dev, generator=gen).to(dtype)  # noqa: E731
    qkv, weight, conv = rand(B, C), rand(C, WIDTH), rand(B, C, WIDTH - 1)
    ssm, slots = rand(B, HV, K, K, dtype=torch.float32) * 0.1, torch.randperm(B, device=dev, generator=gen)
    z, norm_weight = rand(B, HV, K), rand(K)
    if family == "gdn":
        gate = RawGate(rand(B, HV), rand(B, HV), rand(HV), rand(HV))
        tokens = RawGate(gate.a[:, None], gate.b[:, None], gate.A_log, gate.dt_bias)
        norm = gated_rms_norm_triton
    else:
        gate = KDARawGate(rand(B, H, K), rand(B, H), rand(H), rand(H * K, dtype=torch.float32))
        tokens = KDARawGate(gate.g_raw[:, None], gate.b[:, None], gate.A_log, gate.dt_bias)
        norm = sigmoid_gated_rms_norm_triton

    def one() -> None:
        delta_rule_mixer_decode_triton(qkv, weight, conv, slots, None, ssm, gate, z, norm_weight, EPS, H)

    def three() -> None:
        y = causal_conv1d_update_triton(qkv[:, None], weight, None, conv, slots, "silu")
        q, k, v = y.split([H * K, H * K, HV * K], dim=-1)
        o = delta_rule_decode_triton(q.view(B, 1, H, K), k.view(B, 1, H, K), v.view(B, 1, HV, K), None, None, ssm,
                                     slots, use_qk_l2norm_in_kernel=True, gate=tokens)
        norm(o[:, 0], z, norm_weight, EPS)

    return one, three


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--families", nargs="+", default=["gdn", "kda"], choices=sorted(SHAPES))
    ap.add_argument("--chain", type=int, default=20, help="calls a captured graph runs back to back")
    ap.add_argument("--repeats", type=int, default=20)
    add_json_arg(ap)
    args = ap.parse_args()
    dev = "cuda"
    record = Record(args.json, "ops_mixer_decode", dev, vars(args))
    print(f"{'op':4} {'batch':>5} {'one launch us':>14} {'three launches us':>18} {'three / one':>12}")
    for family in args.families:
        for B in args.batches:
            times = []
            for fn in variants(family, B, dev):
                chain = graphed(lambda fn=fn: [fn() for _ in range(args.chain)], dev, True)
                times.append(median(time_runs(chain, dev, args.repeats, warmup=3)) / args.chain * 1e6)
            one, three = times
            print(f"{family:4} {B:>5} {one:>14.2f} {three:>18.2f} {three / one:>11.2f}x")
            record.add(op=family, batch=B, one_us=one, three_us=three, ratio=three / one)
    record.close()


if __name__ == "__main__":
    main()
