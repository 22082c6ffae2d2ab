"""Cache bookkeeping per decode step, plan plus execution, with no forward in between.

Per step, for the same B rows: `planner.allocate` + `planner.plan_step` + `store.execute` (index tensors
ready for the runner) + `planner.check_accept` + `store.accept` (the state modules' accept hooks) +
`planner.commit_step`. Requests start from 512-token prompts on 16-token pages and decode one token per
step (`--tokens T`: verify steps of T tokens, all accepted), so a row takes a page every 16 / T steps.
The state is a Mamba2 stack with speculation (replay history, PNAT, conv window) beside attention pages.
Target: 1 us per request per step at batch 1024, on one CPU thread.

Compared in the same run with a per-step rebuild in the style of a simple block manager (Python block
tables turned into padded tensors every step), the pattern the persistent index tensors replace.

    python benchmarks/manager_bookkeeping.py [--batch 1 64 256 1024] [--steps 400] [--tokens 1]
"""
from __future__ import annotations

import argparse
import time

import torch

from hybridcache.cache import CacheConfig, HybridCacheManager, sizing_of
from hybridcache.states import KVPages, Mamba2State

PAGE, PROMPT, DRAFTS, TARGET_US = 16, 512, 3, 1.0


def build_manager(batch: int, steps: int, tokens: int) -> HybridCacheManager:
    state = Mamba2State(4, num_heads=8, head_dim=8, n_groups=1, state_size=16, conv_kernel=4,
                        dtype=torch.bfloat16, num_draft_tokens=DRAFTS)
    pages = KVPages(2, num_kv_heads=2, head_dim=16, page_size=PAGE, dtype=torch.bfloat16)
    per_request = -(-(PROMPT + (steps + 10) * tokens) // PAGE) + 1
    need = sizing_of([state], pages).bytes_for(batch + 1, batch * per_request)
    return HybridCacheManager([state], pages, CacheConfig(device_bytes=need, num_slots=batch, page_size=PAGE))


def ours(batch: int, steps: int, tokens: int) -> float:
    """Seconds per decode step of `batch` rows."""
    mgr = build_manager(batch, steps, tokens)
    planner, store = mgr.planner, mgr.store
    ids = list(range(batch))
    for r in ids:
        planner.add(r)
    mgr.prepare_step(ids, PROMPT)
    mgr.accept()
    for r in ids:
        planner.start_generation(r)
    valid = [tokens] * batch

    def step() -> None:
        assert planner.allocate(ids, tokens)
        plan = planner.plan_step(ids, tokens)
        store.execute(plan)
        accept = planner.check_accept(plan, valid)
        store.accept(accept)
        planner.commit_step(plan, accept)

    for _ in range(10):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dt = time.perf_counter() - t0
    mgr.check_integrity()
    assert all(planner.entry(r).num_tokens == PROMPT + (steps + 10) * tokens for r in ids)
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
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256, 1024])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=1, help="tokens fed and accepted per step (1..%d)" % (DRAFTS + 1))
    ap.add_argument("--repeat", type=int, default=3, help="runs per batch size; the fastest is reported")
    args = ap.parse_args()
    if not 1 <= args.tokens <= DRAFTS + 1:
        ap.error(f"--tokens must be in 1..{DRAFTS + 1}")
    torch.set_num_threads(1)
    print(f"{'batch':>6} {'ours us/step':>13} {'us/req':>7} {'rebuild us/step':>16} {'us/req':>7} {'speedup':>8}")
    for b in args.batch:
        o = min(ours(b, args.steps, args.tokens) for _ in range(args.repeat))
        r = min(baseline(b, args.steps) for _ in range(args.repeat))
        print(f"{b:>6} {o * 1e6:>13.1f} {o * 1e6 / b:>7.3f} {r * 1e6:>16.1f} {r * 1e6 / b:>7.3f} {r / o:>7.2f}x")
    print(f"target: {TARGET_US:.1f} us per request per step at batch 1024")
    if args.tokens > 1:
        print("(the rebuild baseline feeds one token per step)")


if __name__ == "__main__":
    main()
