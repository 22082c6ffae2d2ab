"""Tiling sweep for the gated-delta-rule Triton kernels (value columns per program x warps), CUDA graphs.

For each batch size, times plain decode (T = 1), the per-token-states baseline (T = 4, every state written), and the
GDN and KDA verify kernels (T = 4; GDN's history half full, in closed form (g and beta given, or from the raw gate
as the engine launches it) with its state read 32, 64 or 128 key rows at a time, with its register cap as chosen,
none, and 128 to 192 a thread, and token by token; KDA with 3 accepted drafts pending, and with none, as at zero
acceptance; and T = 1, the speculative engine's one-token step), at each (block_v, num_warps), and prints the best
tiling per kernel and batch next to the default's time. `--cases`
takes a regular expression: "gdn verify T=4$" is the closed form's default alone. Shapes: GDN 16 key / 32 value
heads, KDA 16 heads, K = V = 128, bf16 inputs, fp32 states.

    PYTHONPATH=. python benchmarks/tune_delta_rule.py
"""
from __future__ import annotations

import argparse
import itertools
import re

import torch

from benchmarks.ops_mamba2 import timed
from benchmarks.timing import graphed
from hybridcache.ops.delta_rule_triton import delta_rule_decode_triton
from hybridcache.ops.gdn.decode import RawGate
from hybridcache.ops.gdn.triton_verify import gdn_verify_triton
from hybridcache.ops.kda.triton_verify import kda_verify_triton

DEV, ACT = "cuda", torch.bfloat16
H, HV, K, V, HIST, T = 16, 32, 128, 128, 16, 4


def cases(batch: int) -> dict:
    """name -> fn(block_v, num_warps) running one call."""
    r = lambda *s: torch.randn(*s, device=DEV).to(ACT)  # noqa: E731
    S = 2 * batch
    slots = torch.randperm(S, device=DEV)[:batch]
    q, k, v = r(batch, T, H, K), r(batch, T, H, K), r(batch, T, HV, V)
    g = -torch.rand(batch, T, HV, device=DEV) * 0.1
    gk = -torch.rand(batch, T, H, K, device=DEV) * 0.1
    beta = torch.rand(batch, T, HV, device=DEV)
    ssm = torch.randn(S, HV, K, V, device=DEV) * 0.1
    inter = torch.empty(S, T, HV, K, V, device=DEV)
    hist = dict(u=r(S, 2, HIST, HV, V), k=r(S, 2, HIST, H, K), G=torch.zeros(S, 2, HV, HIST, device=DEV),
                b=torch.zeros(S, 2, HV, HIST, device=DEV))
    pnat = torch.full((S,), HIST // 2, dtype=torch.int32, device=DEV)
    buf = torch.zeros(S, dtype=torch.int32, device=DEV)
    kssm = torch.randn(S, H, K, V, device=DEV) * 0.1
    pend = dict(k=r(S, T - 1, H, K), g=torch.zeros(S, T - 1, H, K, device=DEV), v=r(S, T - 1, H, V),
                b=torch.zeros(S, T - 1, H, device=DEV), n=torch.full((S,), T - 1, dtype=torch.int32, device=DEV))
    none_pending = torch.zeros_like(pend["n"])

    def kda(pending: torch.Tensor, n: int = T):
        return lambda bv, w: kda_verify_triton(q[:, :n, :H], k[:, :n], v[:, :n, :H], gk[:, :n], beta[:, :n, :H], kssm,
                                               pend["k"], pend["g"], pend["v"], pend["b"], pending, slots,
                                               use_qk_l2norm_in_kernel=True, block_v=bv, num_warps=w)

    raw = RawGate(r(batch, T, HV), r(batch, T, HV), torch.zeros(HV, device=DEV), torch.zeros(HV, device=DEV))

    def gdn(n: int, chunked: bool | None = None, key_block: int | None = None, max_registers: int | None = None,
            gate: RawGate | None = None):
        given = (None, None) if gate else (g[:, :n], beta[:, :n])
        return lambda bv, w: gdn_verify_triton(q[:, :n], k[:, :n], v[:, :n], *given, ssm, hist["u"],
                                               hist["k"], hist["G"], hist["b"], pnat, buf, slots,
                                               use_qk_l2norm_in_kernel=True, block_v=bv, num_warps=w,
                                               chunked=chunked and bv >= 16, key_block=key_block,
                                               max_registers=max_registers, gate=gate)

    return {
        "decode T=1": lambda bv, w: delta_rule_decode_triton(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], ssm,
                                                             slots, use_qk_l2norm_in_kernel=True, block_v=bv,
                                                             num_warps=w),
        "per-token T=4": lambda bv, w: delta_rule_decode_triton(q, k, v, g, beta, ssm, slots,
                                                                use_qk_l2norm_in_kernel=True, block_v=bv,
                                                                intermediate=inter, num_warps=w),
        "gdn verify T=4": gdn(T, True),  # closed form (the default at 16 value columns or more)
        "gdn verify T=4 raw gate": gdn(T, True, gate=raw),  # g and beta from a, b in the kernel, as the engine runs it
        "gdn verify T=4 stepwise": gdn(T, False),
        "gdn verify T=4 key block 64": gdn(T, True, 64),  # the state read 64 key rows at a time (default 32)
        "gdn verify T=4 whole state": gdn(T, True, K),  # and all at once
        **{f"gdn verify T=4 registers {cap}": gdn(T, True, max_registers=cap)  # 0: none; fewer: more programs an SM
           for cap in (0, 128, 144, 168, 192)},
        "kda verify T=4": kda(pend["n"]),
        "kda verify T=4 n=0": kda(none_pending),
        "gdn verify T=1": gdn(1),  # the speculative engine's one-token step
        "kda verify T=1 n=0": kda(none_pending, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--block-v", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--cases", help="only the cases whose names match this regular expression (re.search)")
    args = ap.parse_args()
    for batch in args.batches:
        for name, fn in cases(batch).items():
            if args.cases and not re.search(args.cases, name):
                continue
            times = {}
            for bv, w in itertools.product(args.block_v, args.warps):
                try:
                    times[bv, w] = timed(graphed(lambda: fn(bv, w), DEV, True), DEV, args.iters) * 1e6
                except Exception as exc:  # noqa: BLE001 - a tiling that does not compile is skipped
                    print(f"  {name} B={batch} bv={bv} w={w}: {type(exc).__name__}")
            best = min(times, key=times.get)
            row = "  ".join(f"{bv}x{w}:{us:.1f}" for (bv, w), us in sorted(times.items()))
            print(f"B={batch:<4} {name:18} best bv={best[0]} warps={best[1]} {times[best]:8.1f} us | {row}")


if __name__ == "__main__":
    main()
