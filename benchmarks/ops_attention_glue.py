"""One attention layer's decode step, torch path vs kernel path: us per layer and kernel launches.

    python benchmarks/ops_attention_glue.py                       # CUDA, bf16, the 1b families' shapes
    python benchmarks/ops_attention_glue.py --layer mla --batch 1 --context 8192 --json out.json
    TRITON_INTERPRET=1 python benchmarks/ops_attention_glue.py --device cpu --batch 2 --context 64 --iters 1
        # a smoke run through Triton's interpreter (kernels_on_cpu): checks the glue, times nothing useful

Layers (the `1b` sizes of benchmarks/families.py): `gqa` NemotronH's PagedGQAAttention (32 x 8 heads of 128),
`gated` Qwen3-Next's GatedPagedAttention (16 x 2 heads of 256, partial RoPE 64), `mla` Kimi Linear's
MLAAttention (16 heads, R 512, Dr 64, Dn = Dv 128). Every row decodes one token after `context - 1` cached
ones, page size 16, shuffled pages. The whole layer forward runs (projections, page write, attention,
output projection), as a decode step of the engine runs it: with the row lengths known on the host and the
page table checked (`HostRows`) eagerly, and as a CUDA graph replay with lengths unknown
(`uniform_new`, as engine/graphs.py captures it). Paths:
- torch: the vectorized torch write and attention (`paged.write_kv` / `attend_kv_pages_torch`,
  `mla.write_latent` + gather + masked SDPA), the Triton kernels switched off;
- kernels: the Triton page write (`triton_write.py`) and attention (`triton_paged.py` / `triton_mla.py`).
Launches: CUDA kernels of one eager forward counted by the profiler (on a CPU the outermost aten ops,
the interpreter's own among them: not a launch count). Outputs of the two paths are compared (bf16
tolerance) before timing.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace
from contextlib import contextmanager
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.record import Record, add_json_arg
from benchmarks.timing import graphed, median, time_runs
from hybridcache.models.batch import ForwardBatch
from hybridcache.ops.attention import HostRows, mla, paged

PAGE_SIZE = 16
SHAPES = {
    "gqa": dict(hidden=2048, heads=32, kv_heads=8, head_dim=128),
    "gated": dict(hidden=2048, heads=16, kv_heads=2, head_dim=256, rotary_dim=64),
    "mla": dict(hidden=2048, heads=16, rank=512, rope_dim=64, nope_dim=128, v_dim=128),
}


@contextmanager
def torch_path() -> Iterator[None]:
    """The ops' Triton entry points hidden, so that every call takes its torch path."""
    saved = [(m, n, getattr(m, n)) for m, names in ((paged, ("attend_kv_pages_triton", "write_kv_triton")),
                                                    (mla, ("mla_attend_triton", "write_latent_triton")))
             for n in names]
    for m, n, _ in saved:
        setattr(m, n, None)
    try:
        yield
    finally:
        for m, n, f in saved:
            setattr(m, n, f)


def build_layer(kind: str, device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, str, tuple[int, ...]]:
    """A layer with random weights (norm weights neutral); returns it, its page role, one page's shape."""
    from hybridcache.models.layers.attention import KV_ROLE, PagedGQAAttention
    from hybridcache.models.layers.gated_attention import GatedPagedAttention
    from hybridcache.models.layers.mla_attention import LATENT_ROLE, MLAAttention
    from hybridcache.models.layers.rope import PartialRoPE

    s = SHAPES[kind]
    if kind == "gqa":
        layer = PagedGQAAttention(0, s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], False, device, dtype)
    elif kind == "gated":
        rope = PartialRoPE(s["head_dim"], s["rotary_dim"], 1e7, device)
        layer = GatedPagedAttention(0, s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], False, rope, 1e-6,
                                    device, dtype)
    else:
        layer = MLAAttention(0, s["hidden"], s["heads"], None, s["rank"], s["nope_dim"], s["rope_dim"], s["v_dim"],
                             False, device, dtype)
    gen = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "norm" in name:
                p.fill_(0.0 if kind == "gated" else 1.0)  # Qwen3-Next's norms are zero-centred (1 + w)
            else:
                p.normal_(0.0, p.shape[-1] ** -0.5, generator=gen)
    if kind == "mla":
        return layer, LATENT_ROLE, (PAGE_SIZE, s["rank"] + s["rope_dim"])
    return layer, KV_ROLE, (2, PAGE_SIZE, s["kv_heads"], s["head_dim"])


def make_batch(role: str, page_shape: tuple[int, ...], batch: int, context: int, device: str, dtype: torch.dtype,
               graph: bool) -> ForwardBatch:
    """Every row: `context - 1` cached tokens (random pages), one new token. Lengths on the host eagerly;
    unknown (uniform_new) for a graph."""
    per_row = -(-context // PAGE_SIZE)
    pages = torch.randn(1, batch * per_row, *page_shape, device=device, dtype=dtype)
    table = torch.randperm(batch * per_row, device=device).view(batch, per_row).to(torch.int32)
    cached = np.full(batch, context - 1, dtype=np.int64)
    host = (HostRows(None, None, pages_checked=True, uniform_new=1) if graph
            else HostRows(cached, np.ones(batch, dtype=np.int64), pages_checked=True))
    return ForwardBatch(
        positions=torch.full((batch,), context - 1, device=device, dtype=torch.int64),
        cu_seqlens=torch.arange(batch + 1, device=device, dtype=torch.int32),
        cached_lens=torch.full((batch,), context - 1, device=device, dtype=torch.int32),
        slots=torch.arange(batch, device=device), has_initial=torch.ones(batch, dtype=torch.bool, device=device),
        page_table=table, num_context_rows=0, num_context_tokens=0, generation_tokens=1, states={},
        pages={role: pages}, speculative=False, host_rows=host,
    )


def launches(fn: Callable[[], object], device: str) -> int:
    """CUDA kernels (aten ops on a CPU: the outermost ones) of one call."""
    cuda = device == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    if cuda:
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in prof.events() if e.cpu_parent is None)


def run_case(kind: str, batch: int, context: int, args: argparse.Namespace) -> dict:
    dtype, dev = getattr(torch, args.dtype), args.device
    layer, role, page_shape = build_layer(kind, dev, dtype)
    x = torch.randn(batch, SHAPES[kind]["hidden"], device=dev, dtype=dtype)
    eager, static = (make_batch(role, page_shape, batch, context, dev, dtype, g) for g in (False, True))
    static = replace(static, pages=eager.pages)  # one pool: graph and eager alike
    row = dict(layer=kind, batch=batch, context=context)
    outs = {}
    for path in ("torch", "kernels"):
        with torch_path() if path == "torch" else cpu_kernels(dev):
            call = lambda b=eager: layer(x, b)  # noqa: E731
            with torch.no_grad():
                outs[path] = call()
                row[f"{path}_launches"] = launches(call, dev)
                row[f"{path}_eager_us"] = 1e6 * median(time_runs(call, dev, repeats=args.iters, inner=args.inner))
                if dev == "cuda":
                    replay = graphed(lambda: layer(x, static), dev, use_graph=True)
                    row[f"{path}_graph_us"] = 1e6 * median(time_runs(replay, dev, repeats=args.iters,
                                                                     inner=args.inner))
    torch.testing.assert_close(outs["kernels"], outs["torch"], atol=5e-2, rtol=5e-2)
    return row


@contextmanager
def cpu_kernels(device: str) -> Iterator[None]:
    """On a CPU, the kernel path runs in Triton's interpreter (TRITON_INTERPRET=1 must be set)."""
    if device == "cuda":
        yield
        return
    from hybridcache.ops.triton_support import kernels_on_cpu

    with kernels_on_cpu():
        yield


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--layer", choices=sorted(SHAPES), nargs="+", default=["gqa", "gated", "mla"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--context", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--iters", type=int, default=5, help="timed runs (the median is reported)")
    ap.add_argument("--inner", type=int, default=20, help="back-to-back calls per timed run")
    add_json_arg(ap)
    args = ap.parse_args()
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("--device cpu runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    record = Record(args.json, "ops_attention_glue", args.device, vars(args))
    graph = args.device == "cuda"
    print(f"one layer's decode step, {args.dtype}, page size {PAGE_SIZE}; us per layer (eager"
          + (", graph replay" if graph else "") + "), launches of one eager call")
    head = f"{'layer':>6} {'batch':>5} {'context':>7} {'torch us':>9} {'kern us':>9}"
    head += f" {'torch gr':>9} {'kern gr':>9}" if graph else ""
    print(head + f" {'torch #':>8} {'kern #':>7}")
    for kind in args.layer:
        for batch in args.batch:
            for context in args.context:
                row = run_case(kind, batch, context, args)
                record.add(**row)
                line = (f"{kind:>6} {batch:>5} {context:>7} {row['torch_eager_us']:>9.1f}"
                        f" {row['kernels_eager_us']:>9.1f}")
                if graph:
                    line += f" {row['torch_graph_us']:>9.1f} {row['kernels_graph_us']:>9.1f}"
                print(line + f" {row['torch_launches']:>8} {row['kernels_launches']:>7}")
                if args.device == "cuda":
                    torch.cuda.empty_cache()
    record.close()


if __name__ == "__main__":
    main()
