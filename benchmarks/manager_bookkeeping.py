"""Manager bookkeeping per decode step: prepare (index tensors ready for the runner) + accept.

Trace: B requests with 512-token prompts on 16-token pages, decoding one token per step. Compared in the
same run with a per-step rebuild in the style of a simple block manager (Python block tables turned
into padded tensors every step), the pattern the persistent index tensors replace.

    python benchmarks/manager_bookkeeping.py [--batch 64 256 1024] [--steps 200]
"""
from __future__ import annotations

import argparse
import time

import torch

from hybridcache.cache import CacheConfig, HybridCacheManager, sizing_of
from hybridcache.states import KVPages, Mamba2State

PAGE, PROMPT = 16, 512


def build_manager(batch: int, steps: int) -> HybridCacheManager:
    state = Mamba2State(4, num_heads=8, head_dim=8, n_groups=1, state_size=16, conv_kernel=4, dtype=torch.bfloat16)
    pages = KVPages(2, num_kv_heads=2, head_dim=16, page_size=PAGE, dtype=torch.bfloat16)
    need = sizing_of([state], pages).bytes_for(batch + 1, batch * (-(-(PROMPT + steps) // PAGE) + 1))
    return HybridCacheManager([state], pages, CacheConfig(device_bytes=need, num_slots=batch, page_size=PAGE))


def ours(batch: int, steps: int) -> float:
    mgr = build_manager(batch, steps)
    ids = list(range(batch))
    for r in ids:
        mgr.add_request(r)
    mgr.prepare_step(ids, PROMPT)
    mgr.accept()
    for r in ids:
        mgr.start_generation(r)
    ones = [1] * batch
    for _ in range(5):
        mgr.prepare_step(ids, 1)
        mgr.accept(ones)
    t0 = time.perf_counter()
    for _ in range(steps):
        mgr.prepare_step(ids, 1)
        mgr.accept(ones)
    dt = time.perf_counter() - t0
    mgr.check_integrity()
    return dt / steps


class RebuildEachStep:
    """The alternative: per-request block lists; every step appends where needed and rebuilds tensors."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(num_blocks))
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def add(self, rid: int, prompt: int) -> None:
        n = -(-prompt // PAGE)
        self.tables[rid] = [self.free.pop() for _ in range(n)]
        self.lens[rid] = prompt

    def step(self, ids: list[int]) -> tuple[torch.Tensor, ...]:
        slot_mapping, context_lens, tables = [], [], []
        for rid in ids:
            table = self.tables[rid]
            n = self.lens[rid] + 1
            if n > len(table) * PAGE:
                table.append(self.free.pop())
            self.lens[rid] = n
            slot_mapping.append(table[-1] * PAGE + (n - 1) % PAGE)
            context_lens.append(n)
            tables.append(table)
        width = max(len(t) for t in tables)
        padded = [t + [-1] * (width - len(t)) for t in tables]
        return (torch.tensor(slot_mapping, dtype=torch.int32), torch.tensor(context_lens, dtype=torch.int32),
                torch.tensor(padded, dtype=torch.int32))


def baseline(batch: int, steps: int) -> float:
    bm = RebuildEachStep(batch * (-(-(PROMPT + steps + 5) // PAGE) + 1))
    ids = list(range(batch))
    for r in ids:
        bm.add(r, PROMPT)
    for _ in range(5):
        bm.step(ids)
    t0 = time.perf_counter()
    for _ in range(steps):
        bm.step(ids)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'batch':>6} {'ours us/step':>13} {'us/req':>7} {'rebuild us/step':>16} {'us/req':>7} {'speedup':>8}")
    for b in args.batch:
        o, r = ours(b, args.steps), baseline(b, args.steps)
        print(f"{b:>6} {o * 1e6:>13.1f} {o * 1e6 / b:>7.3f} {r * 1e6:>16.1f} {r * 1e6 / b:>7.3f} {r / o:>7.2f}x")


if __name__ == "__main__":
    main()
