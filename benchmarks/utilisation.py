"""Device cache utilisation: the old fixed half split against the demand-following split, in one run.

A seeded mixed-length workload (prompt lengths and max_tokens drawn log-uniformly over a wide range) runs
to completion, greedy, under the same device budget twice:
  fixed:  num_slots = what the old default gave, min(max_num_seqs, budget // 2 // bytes_per_slot)
  demand: num_slots=None, the split follows the requests
The budget is `--budget-requests` (8) times the longest request's bytes and max_num_seqs admits every
request, so memory is the constraint. Per step (as scheduled, before the forward) it records the share of
the budget held by live requests (their slots and the pages they hold, over device_cache_bytes) and the
requests running. It prints, for both, the means over the whole run and over the steps that left requests
queued (the drain at the end, when the last long requests run alone, is where no split can hold more),
the ratios, and whether the targets are met: the demand split holds >= 85% and runs >= 1.5x the fixed
split's mean concurrency.

The model is `small` by default: tiny compute with the 1b's proportion of slot bytes to K/V bytes (a slot
weighs about 1000 tokens of K/V). What the half split gets wrong depends on that proportion: with `tiny`
(a slot weighs about 100 tokens, near the mean request's pages) half is close to right and the demand split
only matches it. The step counts are deterministic; wall time on a shared CPU is not.

    python benchmarks/utilisation.py                      # small nemotron_h on the CPU, 64 requests
    python benchmarks/utilisation.py --family qwen3_next --size tiny --budget-requests 4
"""
from __future__ import annotations

import argparse
import math
import os
import random
import time
from dataclasses import dataclass

from benchmarks.engine_throughput import sync
from benchmarks.families import add_model_args, checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HELD_TARGET, CONCURRENCY_TARGET = 0.85, 1.5


def workload(num: int, vocab: int, seed: int, min_len: int, max_len: int) -> tuple[list[list[int]], list[int]]:
    """Prompts and max_tokens, each log-uniform in [min_len, max_len] (as many short requests as long)."""
    rng = random.Random(seed)

    def length() -> int:
        return int(round(math.exp(rng.uniform(math.log(min_len), math.log(max_len)))))

    prompts, max_tokens = [], []
    for _ in range(num):
        prompts.append([rng.randrange(3, vocab) for _ in range(length())])
        max_tokens.append(length())
    return prompts, max_tokens


@dataclass
class Trace:
    """Per scheduled step: the share of the budget held by live requests, the requests running."""

    held: list[float]
    running: list[int]
    queued: list[bool]  # requests were left waiting or suspended: demand exceeded the cache
    wall: float
    outputs: list[list[int]]
    num_rebalances: int
    num_suspensions: int
    num_reprefills: int

    def mean(self, values: list[float], queued_only: bool = False) -> float:
        """Mean over steps (time counted in steps: on an accelerator a decode step costs about the same
        whatever its rows); with `queued_only`, over the steps that left requests queued (the drain at the
        end, when the last requests run alone, excluded)."""
        picked = [v for v, q in zip(values, self.queued) if q or not queued_only]
        return sum(picked) / max(len(picked), 1)


def run(llm, prompts: list[list[int]], params: list, device: str) -> Trace:
    """All requests queued at once, stepped to completion; the scheduler is wrapped to sample each step."""
    sched, planner, sizing = llm.scheduler, llm.manager.planner, llm.sizing
    budget = llm.manager.config.device_bytes
    held: list[float] = []
    running: list[int] = []
    queued: list[bool] = []
    schedule = sched.schedule

    def sampled_schedule():
        step = schedule()
        slots, pages = planner.slot_pool.num_owned, planner.page_pool.num_owned
        held.append((slots * sizing.bytes_per_slot + pages * sizing.bytes_per_page) / budget)
        running.append(len(sched.running))
        queued.append(bool(sched.waiting or sched.suspended))
        return step

    sched.schedule = sampled_schedule
    ids = [llm.add_request(p, q) for p, q in zip(prompts, params)]
    outputs: dict[int, list[int]] = {}
    t0 = time.perf_counter()
    while llm.has_unfinished():
        for out in llm.step():
            outputs[out.request_id] = out.token_ids
    sync(device)
    wall = time.perf_counter() - t0
    del sched.schedule
    s = llm.stats
    return Trace(held, running, queued, wall, [outputs[i] for i in ids], s.num_rebalances,
                 s.num_suspensions, s.num_reprefills)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=8, help="shortest prompt and max_tokens")
    ap.add_argument("--max-len", type=int, default=256, help="longest prompt and max_tokens")
    ap.set_defaults(size="small")
    ap.add_argument("--budget-requests", type=float, default=8.0,
                    help="device budget in units of the longest request's device bytes")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--draft-tokens", type=int, default=0, help="n-gram speculation with this many drafts (0: off)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from hybridcache import LLM, SamplingParams, SpeculativeConfig
    from hybridcache.models.checkpoint import read_config

    path = checkpoint(args)
    vocab = int(read_config(path)["vocab_size"])
    prompts, max_tokens = workload(args.requests, vocab, args.seed, args.min_len, args.max_len)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in max_tokens]
    lengths = [len(p) + m for p, m in zip(prompts, max_tokens)]
    common = dict(device=args.device, dtype=args.dtype, max_num_seqs=args.requests, page_size=args.page_size,
                  max_num_batched_tokens=2048, max_model_len=max(lengths) + 16,
                  speculative=SpeculativeConfig(num_draft_tokens=args.draft_tokens) if args.draft_tokens else None)
    probe = LLM(path, **common)  # the default budget: every request at max_model_len
    probe.generate(prompts[:4], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up, off the clock
    lookahead = args.draft_tokens + 1
    longest = probe.device_bytes_needed(max(lengths) + lookahead)
    budget = int(args.budget_requests * longest)
    fixed_slots = min(args.requests, budget // 2 // probe.sizing.bytes_per_slot)
    mean_bytes = sum(probe.device_bytes_needed(n + lookahead) for n in lengths) / len(lengths)
    print(f"{args.family} {args.size} on {args.device} {args.dtype}; {args.requests} requests, prompt and max_tokens "
          f"log-uniform in [{args.min_len}, {args.max_len}] (lengths {min(lengths)}..{max(lengths)}, mean "
          f"{sum(lengths) / len(lengths):.0f}), page {args.page_size}")
    print(f"budget {budget / 1e6:.2f} MB = {args.budget_requests:g} x the longest request ({longest / 1e3:.0f} KB) "
          f"= {budget / mean_bytes:.1f} x the mean request; slot {probe.sizing.bytes_per_slot / 1e3:.1f} KB, "
          f"page {probe.sizing.bytes_per_page / 1e3:.1f} KB")
    del probe

    traces: dict[str, Trace] = {}
    for name, num_slots in (("fixed", fixed_slots), ("demand", None)):
        llm = LLM(path, **common, device_cache_bytes=budget, num_slots=num_slots)
        carved = f"{llm.manager.num_slots} slots / {llm.manager.num_pages} pages"
        traces[name] = trace = run(llm, prompts, params, args.device)
        print(f"{name:>7}: carved {carved}, ended {llm.manager.num_slots} slots / {llm.manager.num_pages} pages; "
              f"{trace.wall:.1f} s, rebalances {trace.num_rebalances}, suspensions "
              f"{trace.num_suspensions}, re-prefills {trace.num_reprefills}")

    fixed, demand = traces["fixed"], traces["demand"]
    print(f"{'split':>7} {'held':>7} {'running':>8} {'max':>4} {'steps':>6} | {'queued: held':>13} {'running':>8}")
    for name, t in traces.items():
        print(f"{name:>7} {t.mean(t.held):>7.1%} {t.mean(t.running):>8.2f} {max(t.running):>4d} {len(t.held):>6d} | "
              f"{t.mean(t.held, True):>13.1%} {t.mean(t.running, True):>8.2f}")
    held_ratio = demand.mean(demand.held) / fixed.mean(fixed.held)
    print(f"demand / fixed: held {held_ratio:.2f}x, mean running "
          f"{demand.mean(demand.running) / fixed.mean(fixed.running):.2f}x, max running "
          f"{max(demand.running) / max(fixed.running):.2f}x, steps {len(demand.held) / len(fixed.held):.2f}x; "
          f"outputs equal: {fixed.outputs == demand.outputs}")
    for label, queued_only in (("whole run", False), ("queued steps", True)):
        held = demand.mean(demand.held, queued_only)
        conc = demand.mean(demand.running, queued_only) / fixed.mean(fixed.running, queued_only)
        print(f"targets, {label}: held >= {HELD_TARGET:.0%} {'met' if held >= HELD_TARGET else 'NOT met'} "
              f"({held:.1%}); mean running >= {CONCURRENCY_TARGET}x fixed "
              f"{'met' if conc >= CONCURRENCY_TARGET else 'NOT met'} ({conc:.2f}x)")


if __name__ == "__main__":
    main()
