"""Software-pipeline depth of the Triton kernels that loop over loads: Triton's launch option `num_stages` (how
many iterations of such a loop are in flight; 3 on sm_90 when a launch names none) at 1 to 4 against the
launch as the op makes it, each kernel at its op's default tiling, CUDA graphs, µs per call.

On an H100 (2026-12-06) the GDN closed-form verify ran 15% faster at 1 stage than at 3, Mamba2's verify 4% at
2 (and 3.3x slower at 1): both now name theirs. This times every such kernel in one call, so that each can
name its best: the verify kernels (tune_delta_rule's and tune_mamba2_verify's shapes), the MoE expert kernels
(the sorted pair kernels from 16 tokens, the one-pair kernels below; qwen3_next's and kimi_linear's 1B
shapes, router output given) and GQA decode attention (tune_decode_attention's shapes, 1,024 keys).
A launch is rerouted by replacing the op module's kernel with a proxy that sets `num_stages` on each launch.

    PYTHONPATH=. python benchmarks/tune_stages.py --batches 1 16 64 256 [--cases "moe"]
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager
from types import ModuleType
from typing import Callable

import torch

from benchmarks import tune_decode_attention, tune_delta_rule, tune_mamba2_verify
from benchmarks.ops_mamba2 import timed
from benchmarks.ops_moe import shapes
from benchmarks.timing import graphed
from hybridcache.ops.attention import triton_paged
from hybridcache.ops.gdn import triton_verify_chunked
from hybridcache.ops.mamba2 import triton_verify as mamba2_verify
from hybridcache.ops.moe import experts_sorted_triton, experts_triton
from hybridcache.ops.moe.experts_sorted_triton import sort_pairs_triton, sorted_experts_triton
from hybridcache.ops.moe.experts_triton import fused_experts_triton

DEV, ACT = "cuda", torch.bfloat16
STAGES = (None, 1, 2, 3, 4)  # None: the launch as the op makes it
SORTED_FROM = 16  # tokens: the sorted kernels' cases from here, the one-pair kernels' below


class Staged:
    """Stands for a Triton kernel: its launches with num_stages=stages (None: as the op makes them), counted."""

    def __init__(self, kernel, stages: int | None):
        self.kernel, self.stages, self.launches = kernel, stages, 0

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.launches += 1
            return launch(*args, **(kwargs if self.stages is None else {**kwargs, "num_stages": self.stages}))
        return run


@contextmanager
def staged(module: ModuleType, name: str, stages: int | None):
    """module.name rerouted through `Staged` while the block runs; an op that launched it not at all (it holds
    the kernel under another name) raises, so that no row times the same launch twice unawares."""
    proxy = Staged(getattr(module, name), stages)
    setattr(module, name, proxy)
    try:
        yield
    finally:
        setattr(module, name, proxy.kernel)
    if not proxy.launches:
        raise RuntimeError(f"{module.__name__}.{name} was never launched through the module")


def experts(family: str, tokens: int, sorted_pairs: bool) -> Callable[[], torch.Tensor]:
    """One call of the MoE experts at `family`'s 1B shapes (gated, silu), random routing."""
    s = shapes(family)
    w = lambda *shape: (torch.randn(*shape, device=DEV) / shape[-1] ** 0.5).to(ACT)  # noqa: E731
    up, gate, down = w(s["E"], s["I"], s["D"]), w(s["E"], s["I"], s["D"]), w(s["E"], s["D"], s["I"])
    x = torch.randn(tokens, s["D"], device=DEV).to(ACT)
    index = torch.stack([torch.randperm(s["E"], device=DEV)[:s["k"]] for _ in range(tokens)])
    weight = torch.rand(tokens, s["k"], device=DEV).to(ACT if family == "qwen3_next" else torch.float32)
    if not sorted_pairs:
        return lambda: fused_experts_triton(x, index, weight, up, down, gate, "silu", ACT)

    def call():
        order, ends = sort_pairs_triton(index, s["E"])
        return sorted_experts_triton(x, index, weight, order, ends, up, down, gate, "silu", ACT)
    return call


def cases(batch: int) -> dict[str, tuple[ModuleType, str, Callable]]:
    """name -> (the op module, its kernel's name there, one call at `batch` rows or tokens)."""
    gdn = tune_delta_rule.cases(batch)["gdn verify T=4"]
    mamba2, _, _ = tune_mamba2_verify.call(batch)
    # Mamba2's verify by default is the heads form, whose loop names its stages (triton_verify_heads.NUM_STAGES,
    # timed there): the case here is the one-head closed form, at its tiling on these shapes (block_p 64)
    out = {"gdn verify T=4": (triton_verify_chunked, "_gdn_verify_chunked_kernel",
                              lambda: gdn(triton_verify_chunked.BLOCK_V, None)),
           "mamba2 verify T=4": (mamba2_verify, "_verify_kernel", mamba2(64, True))}
    for family in ("qwen3_next", "kimi_linear"):
        many = batch >= SORTED_FROM
        call = experts(family, batch, many)
        module = experts_sorted_triton if many else experts_triton
        kind = "sorted" if many else "one-pair"
        out[f"moe {kind} up {family}"] = (module, "_sorted_up_kernel" if many else "_up_kernel", call)
        out[f"moe {kind} down {family}"] = (module, "_sorted_down_kernel" if many else "_down_kernel", call)
    for name in tune_decode_attention.GQA:
        attend, _ = tune_decode_attention.case(name, batch, 1024, DEV)
        out[f"{name} 1024 keys"] = (triton_paged, "_attend_kernel", lambda attend=attend: attend(None, None, None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--cases", help="only the cases whose names contain this text")
    args = ap.parse_args()
    print("us per call at num_stages (as launched: the op's own choice, else Triton's)")
    for batch in args.batches:
        for name, (module, kernel, call) in cases(batch).items():
            if args.cases and args.cases not in name:
                continue
            cells = {}
            for stages in STAGES:
                try:
                    with staged(module, kernel, stages):
                        cells[stages] = timed(graphed(call, DEV, True), DEV, args.iters) * 1e6
                except Exception as exc:  # noqa: BLE001 - a depth that does not compile or fit: reported
                    print(f"  {name} B={batch} stages={stages}: {type(exc).__name__}: {exc}")
            if not cells:
                continue
            best = min(cells, key=cells.get)
            row = "  ".join(f"{'launched' if s is None else s}: {us:7.1f}" for s, us in cells.items())
            print(f"B={batch:<4} {name:34} best {'launched' if best is None else best:>8} | {row}", flush=True)


if __name__ == "__main__":
    main()
