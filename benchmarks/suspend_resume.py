"""Suspend + resume throughput of a batch of requests against a plain pinned `copy_` of the same bytes.

Nemotron-H-like roles by default: 12 Mamba2 layers of 64 heads x 64 x 128 fp32 state with the replay
history for k = 3 drafts, and 3 attention layers (8 KV heads x 128, bf16) holding `--context` tokens.
The ratio is (plain copy time) / (manager time) for the same live bytes, each way and round trip.

    python benchmarks/suspend_resume.py [--device cuda] [--batch 32] [--context 1024]
"""
from __future__ import annotations

import argparse
import time

import torch

from hybridcache.cache import CacheConfig, HybridCacheManager
from hybridcache.states import KVPages, Mamba2State


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeat: int) -> float:
    fn()
    sync(device)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    device = torch.device(args.device)
    small = device.type == "cpu"
    batch = args.batch or (4 if small else 32)
    layers = args.layers or (2 if small else 12)
    state = Mamba2State(layers, num_heads=64, head_dim=64, n_groups=8, state_size=128, conv_kernel=4,
                        dtype=torch.bfloat16, num_draft_tokens=3)
    pages = KVPages(3, num_kv_heads=8, head_dim=128, page_size=16, dtype=torch.bfloat16)
    probe = HybridCacheManager([state], pages, CacheConfig(device_bytes=1 << 30, num_slots=1, page_size=16))
    per_req_pages = -(-args.context // 16)
    device_bytes = probe.sizing.bytes_for(batch + 1, batch * per_req_pages)
    host_bytes = int(batch * (probe.host_tier.slot_layout.nbytes + per_req_pages * probe.host_tier.page_layout.nbytes) * 1.05)
    del probe
    mgr = HybridCacheManager([state], pages, CacheConfig(device_bytes=device_bytes, host_bytes=host_bytes,
                                                         host_num_slots=batch, page_size=16, num_slots=batch, device=str(device)))
    ids = list(range(batch))
    for r in ids:
        mgr.add_request(r)
    mgr.prepare_step(ids, args.context)
    mgr.accept()
    for r in ids:
        mgr.start_generation(r)
    for t in list(mgr.device_tier.slots.values()) + list(mgr.device_tier.pages.values()):
        if t.dtype.is_floating_point:
            t.normal_()
    live = sum(r.live_row_bytes for r in mgr.slot_roles) * batch + sum(
        r.row_bytes for r in mgr.page_roles) * batch * per_req_pages

    def suspend() -> None:
        mgr.suspend(ids)
        mgr.synchronize()

    def resume() -> None:
        mgr.resume(ids)
        mgr.synchronize()

    t_suspend, t_resume = float("inf"), float("inf")
    for _ in range(args.repeat + 1):
        t_suspend = min(t_suspend, _once(suspend, device))
        t_resume = min(t_resume, _once(resume, device))

    src = torch.empty(live, dtype=torch.uint8, device=device)
    host = torch.empty(live, dtype=torch.uint8, pin_memory=device.type == "cuda")
    t_d2h = timed(lambda: host.copy_(src, non_blocking=True), device, args.repeat)
    t_h2d = timed(lambda: src.copy_(host, non_blocking=True), device, args.repeat)
    gb = live / 1e9
    print(f"device {device}, batch {batch}, context {args.context}, live bytes {gb:.3f} GB "
          f"({live / batch / 1e6:.1f} MB per request; whole-slot copy would be "
          f"{(mgr.sizing.bytes_per_slot + per_req_pages * mgr.sizing.bytes_per_page) / 1e6:.1f} MB)")
    print(f"{'':>10} {'manager GB/s':>13} {'plain copy GB/s':>16} {'ratio':>6}")
    for name, ours, plain in (("to host", t_suspend, t_d2h), ("to device", t_resume, t_h2d),
                              ("round trip", t_suspend + t_resume, t_d2h + t_h2d)):
        mult = 2 if name == "round trip" else 1
        print(f"{name:>10} {mult * gb / ours:>13.1f} {mult * gb / plain:>16.1f} {plain / ours:>6.2f}")


def _once(fn, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
