"""The engine's host work per steady step with the model taken out: scheduler, planner, drafter, token
history, sampling and bookkeeping, the part of a step that must stay under the device's (with asynchronous
scheduling it overlaps the step before; past the device's step time it is what a step costs).

The model's forward returns zeros and its LM head a fixed table of random logits, so what is timed is the
engine alone. Modes as `step_profile.py`: `plain` (asynchronous decode), `spec-idle` (the speculative engine,
every row backing off for good: plain steps), `spec-chain` (every row backing off a short pause: one-token steps
chained on the verify chain), `verify` (k = 3 drafts a row, never the greedy token). Off CUDA there are no graphs: the drafts' choice and the state modules' accept hooks, which a
CUDA graph holds, run here on the host too. Figures are host ms a step and the ratio to `plain` in one run.

    PYTHONPATH=. python benchmarks/host_overhead.py --family kimi_linear --batch 1 16 64
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from benchmarks.families import add_model_args, checkpoint
from benchmarks.record import Record, add_json_arg
from benchmarks.step_profile import idle_steps, steady_engine
from benchmarks.timing import REPEATS, median

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODES = {"plain": 0, "spec-idle": 3, "spec-chain": 3, "verify": 3}  # mode -> draft tokens


def stub_model(llm) -> None:
    """The forward returns zeros [N, 1] and the LM head rows of one fixed table of random logits."""
    model = llm.runner.model
    device = next(model.parameters()).device
    table = torch.randn(4096, llm.vocab_size, generator=torch.Generator().manual_seed(0)).to(device)
    model.forward = lambda ids, batch: torch.zeros(len(ids), 1, device=device)
    model.logits = lambda hidden: table[: len(hidden)]


def engine(path, args, batch: int, mode: str):
    llm = steady_engine(path, args.device, args.dtype, batch, args.prompt_len,
                        args.prompt_len + 4 * args.steps * (REPEATS + 2) + 64, MODES[mode], idle_steps(mode))
    stub_model(llm)
    for _ in range(4):
        llm.step()
    return llm


def host_ms(llm, steps: int) -> float:
    runs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(steps):
            llm.step()
        runs.append((time.perf_counter() - t0) / steps * 1e3)
    return median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=40, help="steps a timed run (median of 5 runs)")
    ap.add_argument("--prompt-len", type=int, default=128)
    add_json_arg(ap)
    args = ap.parse_args()
    path = checkpoint(args)
    record = Record(args.json, "host_overhead", args.device, dict(family=args.family, size=args.size,
                                                                dtype=args.dtype, steps=args.steps))
    print(f"{args.family} {args.size} on {args.device}: host ms a step, model stubbed (median of {REPEATS} runs)")
    print(f"{'batch':>5} " + " ".join(f"{m:>10}" for m in MODES) + "   ratios to plain")
    for b in args.batch:
        ms = {m: host_ms(engine(path, args, b, m), args.steps) for m in MODES}
        record.add(batch=b, **{f"{m.replace('-', '_')}_ms": v for m, v in ms.items()})
        ratios = "  ".join(f"{m} {ms[m] / ms['plain']:.2f}x" for m in MODES if m != "plain")
        print(f"{b:>5} " + " ".join(f"{ms[m]:>10.3f}" for m in MODES) + f"   {ratios}")
    record.close()


if __name__ == "__main__":
    main()
