"""Kernel launches in one steady decode step, counted on a CPU: every op runs through its Triton kernel under
Triton's interpreter (`kernels_on_cpu`), and each Triton launch and each aten op that would launch a CUDA
kernel (not a view, not an allocation) is charged to the innermost module that ran it (`engine` outside the
model: sampling, the step's inputs).

    TRITON_INTERPRET=1 python benchmarks/launch_census.py --family qwen3_next --batch 1 4

The checkpoint has the 1B-class checkpoint's layers (`benchmarks/families.py`: pattern, layer kinds, expert
count, a shared expert of 4 routed widths) at the tiny size's widths: the launches depend on the layers and
the code paths, not the widths. On the GPU a step with CUDA graphs replays the same kernels (the counts here
are what the graph holds); `step_profile.py` counts them there.
"""
from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.families import FAMILIES, build
from benchmarks.step_profile import idle_steps, steady_engine

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NO_KERNEL = ("empty", "new_empty", "empty_strided", "empty_like", "lift_fresh", "detach", "alias")
# the 1B-class layers at tiny widths (families.py's `1b` layouts)
LAYERS = {"nemotron_h": dict(hybrid_override_pattern=FAMILIES["nemotron_h"]["1b"]["hybrid_override_pattern"]),
          "qwen3_next": dict(num_hidden_layers=12, num_experts=8, shared_expert_intermediate_size=4 * 64),
          "kimi_linear": dict(num_hidden_layers=12, num_local_experts=8, n_shared_experts=1,
                              linear_attn_config={**FAMILIES["kimi_linear"]["tiny"]["linear_attn_config"],
                                                  **{key: FAMILIES["kimi_linear"]["1b"]["linear_attn_config"][key]
                                                     for key in ("kda_layers", "full_attn_layers")}})}


def launches_kernel(func) -> bool:
    """Whether an aten op would launch a device kernel: it returns a tensor, not a view of its input, not a bare
    allocation."""
    name = func.__name__.split(".")[0]
    if name in NO_KERNEL:
        return False
    returns = func._schema.returns
    if not any(isinstance(r.type, torch.TensorType) for r in returns):  # a scalar answer (promote_types, ...)
        return False
    return not (returns[0].alias_info is not None and not returns[0].alias_info.is_write)


class Census(TorchDispatchMode):
    """Counts (owner, op name) over the aten ops that launch kernels and the Triton launches."""

    def __init__(self) -> None:
        super().__init__()
        self.owners, self.counts, self.in_triton = ["engine"], Counter(), False

    def enter(self, kind: str) -> None:
        self.owners.append(kind)

    def leave(self) -> None:  # returns None: a forward hook's result would replace the module's output
        self.owners.pop()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.in_triton and launches_kernel(func):
            self.counts[(self.owners[-1], f"aten.{func.__name__.split('.')[0]}")] += 1
        return func(*args, **(kwargs or {}))


def watch(model, census: Census) -> list:
    """Forward hooks that keep `census.owners` at the innermost running module's kind; and the Triton spy."""
    from triton.runtime.interpreter import InterpretedFunction

    hooks = []
    for module in model.modules():
        if module is not model:
            kind = type(module).__name__
            hooks.append(module.register_forward_pre_hook(lambda mod, args, kind=kind: census.enter(kind)))
            hooks.append(module.register_forward_hook(lambda mod, args, out: census.leave()))
    run = InterpretedFunction.run

    def spy(self, *args, **kwargs):
        census.counts[(census.owners[-1], self.fn.__name__)] += 1
        census.in_triton = True
        try:
            return run(self, *args, **kwargs)
        finally:
            census.in_triton = False

    InterpretedFunction.run = spy
    return hooks, run


def census_of(path: Path, batch: int, k: int, dtype: str, idle: int = 0) -> Counter:
    """Counts of one steady decode step (k: draft tokens a step, 0 for plain decode; `idle`: every row backing
    off that many steps, as `step_profile.steady_engine` holds it: `step_profile.idle_steps`)."""
    from triton.runtime.interpreter import InterpretedFunction

    from hybridcache.ops.triton_support import kernels_on_cpu

    with kernels_on_cpu():
        llm = steady_engine(path, "cpu", dtype, batch, 8, 1024, k, idle)
        census = Census()
        hooks, run = watch(llm.runner.model, census)
        try:
            with census:
                llm.step()
        finally:
            InterpretedFunction.run = run
            for hook in hooks:
                hook.remove()
    return census.counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", choices=sorted(FAMILIES), default="qwen3_next")
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--draft-tokens", type=int, default=0, help="k of a verify step (0: plain decode)")
    ap.add_argument("--idle", choices=["spec-idle", "spec-chain"], default=None,
                    help="with --draft-tokens k: every row backing off for good, or for a pause that chains")
    ap.add_argument("--dtype", default="bfloat16", help="the ops a step runs can depend on it (casts)")
    ap.add_argument("--ops", action="store_true", help="also list each module kind's ops")
    args = ap.parse_args()
    path = Path(f"/tmp/hybridcache-census-{args.family}")
    if not (path / "config.json").exists():
        FAMILIES[args.family]["census"] = {**FAMILIES[args.family]["tiny"], **LAYERS[args.family]}
        build(path, args.family, "census")
    for batch in args.batch:
        counts = census_of(path, batch, args.draft_tokens, args.dtype, idle_steps(args.idle) if args.idle else 0)
        by_owner = Counter()
        for (owner, _), n in counts.items():
            by_owner[owner] += n
        idle = f" {args.idle}" if args.idle else ""
        print(f"{args.family} bs{batch} k={args.draft_tokens}{idle}: {sum(counts.values())} launches a step")
        for owner, n in by_owner.most_common():
            print(f"  {owner:28} {n:5}")
            if args.ops:
                for (o, op), m in sorted(counts.items(), key=lambda kv: -kv[1]):
                    if o == owner:
                        print(f"      {op:34} {m:5}")


if __name__ == "__main__":
    main()
