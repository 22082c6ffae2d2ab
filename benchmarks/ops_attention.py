"""Decode over paged KV: fast vs naive ms per call and achieved bandwidth (KV bytes read / time).

    python benchmarks/ops_attention.py --device cpu             # small heads, finishes in < 1 min
    python benchmarks/ops_attention.py --device cuda            # 32 x 8 heads x 128, bf16
    python benchmarks/ops_attention.py --op mla --device cuda   # Kimi-like MLA (H 32, R 512, Dr 64)
    python benchmarks/ops_attention.py --op triton --device cuda --context 1024 2048 4096 8192
        # attention only (pages already written): Triton kernel vs the torch path, both timed by
        # triton.testing.do_bench (L2 flushed between calls), against the measured copy bandwidth

One decode step per call: every row writes one new token and attends over ``context`` tokens.
Run from the repository root with the package installed (``./dev`` does it) or ``PYTHONPATH=.``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from hybridcache.ops.attention import mla_paged_attention, naive, paged_attention
from hybridcache.ops.attention.paged import attend_kv_pages_torch

DEFAULTS = {
    "cpu": dict(heads=8, kv_heads=2, head_dim=64, dtype="float32", rank=128, rope_dim=32, iters=5),
    "cuda": dict(heads=32, kv_heads=8, head_dim=128, dtype="bfloat16", rank=512, rope_dim=64, iters=20),
}


def page_table_for(batch: int, context: int, page_size: int, device: str) -> tuple[torch.Tensor, int]:
    """Shuffled pages, `context` tokens per row: [batch, pages per row] int32 and the pool's page count."""
    per_row = -(-context // page_size)
    num_pages = batch * per_row
    table = torch.randperm(num_pages, device=device).view(batch, per_row).to(torch.int32)
    return table, num_pages


def time_call(fn: Callable[[], object], iters: int, device: str) -> float:
    """Median ms of `iters` calls after one warm-up."""
    fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def gqa_case(batch: int, context: int, args: argparse.Namespace) -> tuple[dict[str, Callable], int]:
    dtype, dev, d = getattr(torch, args.dtype), args.device, args.head_dim
    table, num_pages = page_table_for(batch, context, args.page_size, dev)
    kv = torch.randn(num_pages, 2, args.page_size, args.kv_heads, d, device=dev, dtype=dtype)
    q = torch.randn(batch, args.heads, d, device=dev, dtype=dtype)
    k, v = (torch.randn(batch, args.kv_heads, d, device=dev, dtype=dtype) for _ in range(2))
    cached = torch.full((batch,), context - 1, dtype=torch.int32, device=dev)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    calls = {name: (lambda f=f: f(q, k, v, kv, table, cached, cu)) for name, f in
             (("fast", paged_attention), ("naive", naive.paged_attention))}
    return calls, batch * context * 2 * args.kv_heads * d * kv.element_size()


def mla_case(batch: int, context: int, args: argparse.Namespace) -> tuple[dict[str, Callable], int]:
    dtype, dev = getattr(torch, args.dtype), args.device
    h, r, dr, dn = args.heads, args.rank, args.rope_dim, args.head_dim
    table, num_pages = page_table_for(batch, context, args.page_size, dev)
    pages = torch.randn(num_pages, args.page_size, r + dr, device=dev, dtype=dtype)
    q_nope, q_rope = torch.randn(batch, h, dn, device=dev, dtype=dtype), torch.randn(batch, h, dr, device=dev, dtype=dtype)
    latent, k_rope = torch.randn(batch, r, device=dev, dtype=dtype), torch.randn(batch, dr, device=dev, dtype=dtype)
    w_k, w_v = torch.randn(h, dn, r, device=dev, dtype=dtype), torch.randn(h, dn, r, device=dev, dtype=dtype)
    cached = torch.full((batch,), context - 1, dtype=torch.int32, device=dev)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    calls = {name: (lambda f=f: f(q_nope, q_rope, latent, k_rope, pages, table, cached, cu, w_k, w_v)) for name, f in
             (("fast", mla_paged_attention), ("naive", naive.mla_paged_attention))}
    return calls, batch * context * (r + dr) * pages.element_size()


def triton_case(batch: int, context: int, args: argparse.Namespace) -> tuple[dict[str, Callable], int]:
    """Decode attention over `context` tokens already in pages: the torch path and the Triton kernel."""
    from hybridcache.ops.attention.triton_paged import attend_kv_pages_triton

    dtype, dev, d = getattr(torch, args.dtype), args.device, args.head_dim
    table, num_pages = page_table_for(batch, context, args.page_size, dev)
    kv = torch.randn(num_pages, 2, args.page_size, args.kv_heads, d, device=dev, dtype=dtype)
    q = torch.randn(batch, args.heads, d, device=dev, dtype=dtype)
    cached = torch.full((batch,), context - 1, dtype=torch.int32, device=dev)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    calls = {name: (lambda f=f: f(q, kv, table, cached, cu)) for name, f in
             (("torch", attend_kv_pages_torch), ("triton", attend_kv_pages_triton))}
    err = (calls["triton"]().float() - calls["torch"]().float()).abs().max().item()
    assert err < 5e-2, f"triton and torch paths disagree by {err}"
    return calls, batch * context * 2 * args.kv_heads * d * kv.element_size()


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 1 GiB: (read + write bytes) / time, GB/s."""
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    del src, dst
    return 2 * (1 << 30) / ms / 1e6


def run_triton(args: argparse.Namespace) -> None:
    from triton.testing import do_bench

    copy = copy_bandwidth_gbs()
    print(f"measured copy bandwidth: {copy:.0f} GB/s (read + write)")
    print(f"{'batch':>5} {'context':>7} {'KV MB':>8} {'torch ms':>9} {'torch GB/s':>10} {'triton ms':>9} "
          f"{'triton GB/s':>11} {'% copy':>6} {'speedup':>7}")
    for batch in args.batch:
        for context in args.context:
            calls, kv_bytes = triton_case(batch, context, args)
            t_torch, t_triton = (do_bench(calls[k], return_mode="median") for k in ("torch", "triton"))
            bw_torch, bw_triton = kv_bytes / t_torch / 1e6, kv_bytes / t_triton / 1e6
            print(f"{batch:>5} {context:>7} {kv_bytes / 1e6:>8.1f} {t_torch:>9.3f} {bw_torch:>10.0f} {t_triton:>9.3f} "
                  f"{bw_triton:>11.0f} {100 * bw_triton / copy:>5.0f}% {t_torch / t_triton:>7.2f}")
            del calls
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--op", choices=["gqa", "mla", "triton"], default="gqa")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--kv-heads", type=int)
    parser.add_argument("--head-dim", type=int, help="D for GQA; Dn = Dv for MLA")
    parser.add_argument("--rank", type=int, help="MLA latent rank R")
    parser.add_argument("--rope-dim", type=int, help="MLA rope key width Dr")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--iters", type=int)
    parser.add_argument("--no-naive", action="store_true")
    args = parser.parse_args()
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.op == "triton":
        if args.device != "cuda":
            parser.error("--op triton needs --device cuda")
        print(f"gqa decode attention, Triton vs torch: heads {args.heads}, kv heads {args.kv_heads}, head dim "
              f"{args.head_dim}, {args.dtype}, page size {args.page_size}")
        return run_triton(args)
    case = gqa_case if args.op == "gqa" else mla_case
    print(f"{args.op} decode on {args.device}: heads {args.heads}, kv heads {args.kv_heads}, head dim "
          f"{args.head_dim}, {args.dtype}, page size {args.page_size}" +
          (f", R {args.rank}, Dr {args.rope_dim}" if args.op == "mla" else ""))
    print(f"{'batch':>5} {'context':>7} {'KV MB':>8} {'fast ms':>9} {'fast GB/s':>9} {'naive ms':>9} {'naive GB/s':>10} {'speedup':>7}")
    for batch in args.batch:
        for context in args.context:
            calls, kv_bytes = case(batch, context, args)
            fast = time_call(calls["fast"], args.iters, args.device)
            naive_ms = float("nan") if args.no_naive else time_call(calls["naive"], max(1, args.iters // 3), args.device)
            print(f"{batch:>5} {context:>7} {kv_bytes / 1e6:>8.1f} {fast:>9.3f} {kv_bytes / fast / 1e6:>9.2f} "
                  f"{naive_ms:>9.3f} {kv_bytes / naive_ms / 1e6:>10.2f} {naive_ms / fast:>7.2f}")
            del calls
            if args.device == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
