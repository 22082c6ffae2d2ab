"""Mamba2's replay verify kernel token by token against in closed form (`closed_form=True`: the new tokens and
the history's share as products), over head channels a program (block_p) and the closed form's warps, and the
heads form (`triton_verify_heads`: a program a row, group and run of heads) over its runs (`--runs`); CUDA
graphs; GB/s = the state read (the checkpoint, fp32) and the history read / time, against the device's copy
bandwidth. Shapes: nemotron_h 1B (64 heads of 64, 8 groups, state 128), bf16 inputs, T = 4 (k = 3 drafts),
HIST 16 with p = 8 (no fold; `--pnat 13` and up: every row folds).

    PYTHONPATH=. python benchmarks/tune_mamba2_verify.py --batches 1 16 64 256
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.ops_mamba2 import copy_bandwidth, timed
from benchmarks.timing import graphed
from hybridcache.ops.mamba2.common import NO_LIMIT
from hybridcache.ops.mamba2.triton_verify import mamba2_verify_triton
from hybridcache.ops.mamba2.triton_verify_heads import mamba2_verify_heads_triton

DEV, ACT = "cuda", torch.bfloat16
H, P, G, N, HIST, T = 64, 64, 8, 128, 16, 4


def call(batch: int, p: int = HIST // 2):
    """fn(block_p, closed_form, warps) running one verify call with p history tokens a row (every row folds where
    p + T > HIST), and the bytes it must read."""
    r = lambda *s: torch.randn(*s, device=DEV).to(ACT)  # noqa: E731
    S = 2 * batch
    slots = torch.randperm(S, device=DEV)[:batch]
    x, dt, B, C = r(batch, T, H, P), r(batch, T, H), r(batch, T, G, N), r(batch, T, G, N)
    A, D, bias = -torch.rand(H, device=DEV), torch.randn(H, device=DEV), torch.randn(H, device=DEV)
    ssm = torch.randn(S, H, P, N, device=DEV) * 0.1
    rx, rb = r(S, 2, HIST, H, P), r(S, 2, HIST, G, N)
    rdt, rcum = torch.rand(S, 2, H, HIST, device=DEV), -torch.rand(S, 2, H, HIST, device=DEV).cumsum(-1)
    pnat = torch.full((S,), p, dtype=torch.int32, device=DEV)
    buf = torch.zeros(S, dtype=torch.int32, device=DEV)
    read = batch * (H * P * N * 4 + p * (H * P + G * N) * 2)

    def fn(block_p: int, closed_form: bool, warps: int | None = None):
        return lambda: mamba2_verify_triton(x, dt, A, B, C, ssm, rx, rb, rdt, rcum, pnat, buf, slots, D=D, dt_bias=bias,
                                            block_p=block_p, closed_form=closed_form, num_warps=warps)

    def heads(run: int, warps: int | None = None):
        return lambda: mamba2_verify_heads_triton(x, dt, A, B, C, ssm, rx, rb, rdt, rcum, pnat, buf, slots, D, bias,
                                                  NO_LIMIT, run=run, num_warps=warps)
    return fn, heads, read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--block-p", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--warps", type=int, nargs="+", default=[0], help="closed form: warps a program (0: Triton's 4)")
    ap.add_argument("--runs", type=int, nargs="*", default=[1, 2, 4, 8],
                    help="the heads form (`triton_verify_heads`): heads a program (empty: not timed)")
    ap.add_argument("--pnat", type=int, default=HIST // 2,
                    help=f"history tokens a row ({HIST - T + 1}+: every row folds)")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    print(f"copy bandwidth {copy_bandwidth(DEV):.0f} GB/s; p = {args.pnat}; us (GB/s) per block_p")
    for batch in args.batches:
        fn, heads, read = call(batch, args.pnat)
        forms = [("token by token", False, None)] + [
            ("closed form" + (f" {w} warps" if w else ""), True, w or None) for w in args.warps]
        for name, closed_form, warps in forms:
            cells = []
            for bp in args.block_p:
                us = timed(graphed(fn(bp, closed_form, warps), DEV, True), DEV, args.iters) * 1e6
                cells.append(f"{bp}: {us:7.1f} ({read / us / 1e3:5.0f})")
            print(f"B={batch:<4} {name:17} " + "  ".join(cells), flush=True)
        for warps in args.warps:  # the heads form, over heads a program (run) in place of block_p
            cells = []
            for run in args.runs:
                us = timed(graphed(heads(run, warps or None), DEV, True), DEV, args.iters) * 1e6
                cells.append(f"{run}: {us:7.1f} ({read / us / 1e3:5.0f})")
            print(f"B={batch:<4} {'heads ' + str(warps or 4) + ' warps':17} " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
