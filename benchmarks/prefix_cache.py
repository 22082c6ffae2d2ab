"""Prefix caching (issue 12): hit tokens against the ceiling, prefill tokens computed, time to first token
and total time, caching on against off, and the snapshots' share of the device cache.

Workloads (all requests of a wave are submitted at once; greedy, fixed output length):
  shared:    --groups groups of --per-group requests, a --shared-len token prefix per group and unique
             suffixes of 16-256 tokens, --new-tokens generated. Ceiling: every request's shared tokens
             rounded down to the snapshot interval.
  multiturn: --conversations conversations of --turns turns; turn t's prompt is turn t-1's prompt, its
             output and 16-64 new tokens. Ceiling: turns >= 2, the previous turn's committed tokens
             (prompt + output - 1): a finished request's end is saved exactly, inside a page too.
Hits count at admission (`LLM.stats.prefix_cache_hits`); prefill tokens computed are the prompt tokens
minus the hits (no request is preempted at this budget). Each engine first runs a smaller workload of other
tokens, untimed (compilation, autotuning and graph capture at these shapes), then `reset_prefix_cache()`.

    PYTHONPATH=. python benchmarks/prefix_cache.py --quick                                               # CPU smoke
    PYTHONPATH=. python benchmarks/prefix_cache.py --json out/prefix_cache_cpu.json                      # issue sizes
    PYTHONPATH=. python benchmarks/prefix_cache.py --workloads multiturn --cache-scale 1 2               # budget sweep

Wall times on a shared CPU box vary up to 2x between identical runs; compare step counts and prefill
tokens there, times on an idle machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import time

from benchmarks.families import add_model_args, checkpoint
from benchmarks.record import Record, add_json_arg
from hybridcache import LLM, SamplingParams


def run_wave(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[list[list[int]], list[float], float]:
    """(outputs, time to first token per request, wall time) of one wave submitted at once."""
    start = time.perf_counter()
    rids = [llm.add_request(p, params) for p in prompts]
    first: dict[int, float] = {}
    outs: dict[int, list[int]] = {}
    llm.stream_deltas = True
    while len(outs) < len(rids):
        for o in llm.step():
            outs[o.request_id] = o.token_ids
        now = time.perf_counter()
        for d in llm.take_deltas():
            if d.token_ids and d.request_id not in first:
                first[d.request_id] = now - start
    llm.stream_deltas = False
    return [outs[r] for r in rids], [first[r] for r in rids], time.perf_counter() - start


def shared_waves(args, rng: random.Random, groups: int) -> list[list[list[int]]]:
    prompts = []
    for _ in range(groups):
        head = [rng.randrange(3, 1000) for _ in range(args.shared_len)]
        prompts += [head + [rng.randrange(3, 1000) for _ in range(rng.randint(16, 256))] for _ in range(args.per_group)]
    return [prompts]


def workload(args, name: str, rng: random.Random, warmup: bool = False) -> list[list[list[int]]]:
    """The workload's first wave(s); a warm-up's is smaller (two groups, or one batch of conversations)."""
    if name == "shared":
        return shared_waves(args, rng, args.groups if not warmup else min(2, args.groups))
    n = args.conversations if not warmup else min(args.max_num_seqs, args.conversations)
    return [[[rng.randrange(3, 1000) for _ in range(rng.randint(16, 64))] for _ in range(n)]]


def measure(llm: LLM, waves, turns: bool, params: SamplingParams, seed: int = 1) -> dict:
    """Run the waves (multi-turn: each next wave built from the last one's outputs); the figures (the
    counters as the run's own: what they were before it is taken off)."""
    prompts, outputs, ttft, wall, prompt_tokens, ceiling, peak_snap = waves[0], [], [], 0.0, 0, 0, 0
    rng = random.Random(seed)
    s0 = dataclasses.replace(llm.stats)
    for t in range(len(waves) if not turns else turns):
        if t and turns:
            ceiling += sum(len(p) + len(o) - 1 for p, o in zip(prompts, outputs))
            prompts = [p + o + [rng.randrange(3, 1000) for _ in range(rng.randint(16, 64))] for p, o in zip(prompts, outputs)]
        outputs, first, w = run_wave(llm, prompts, params)
        ttft += first
        wall += w
        prompt_tokens += sum(map(len, prompts))
        peak_snap = max(peak_snap, llm.stats.snapshot_bytes)
    s = llm.stats
    hits = s.prefix_cache_hits - s0.prefix_cache_hits
    return {"prompt_tokens": prompt_tokens, "hits": hits, "ceiling": ceiling,
            "prefill_tokens": prompt_tokens - hits, "ttft_mean_s": sum(ttft) / len(ttft),
            "total_s": wall, "snapshot_bytes_peak": peak_snap,
            "evictions": s.prefix_cache_evictions - s0.prefix_cache_evictions,
            "spills": s.prefix_cache_spills - s0.prefix_cache_spills,
            "host_hits": s.prefix_cache_host_hits - s0.prefix_cache_host_hits,
            "snapshot_rows": llm.manager.planner.prefix.snap_pool.total if llm.manager.planner.prefix else 0,
            "outputs": outputs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--per-group", type=int, default=16)
    ap.add_argument("--shared-len", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--quick", action="store_true",
                    help="small sizes (4 groups of 8, 512 shared; 12 conversations of 4 turns; 6 seqs; 32 new tokens)")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help="run a smaller workload of other tokens on each engine first, untimed, then reset its cache")
    ap.add_argument("--workloads", nargs="+", default=["shared", "multiturn"], choices=["shared", "multiturn"])
    ap.add_argument("--cache-scale", type=float, nargs="+", default=[1.0],
                    help="device cache budgets to run, as multiples of the LLM's default (max_num_seqs requests at "
                         "full length, plus snapshot rows); conversations / max_num_seqs holds every conversation")
    ap.add_argument("--host-scale", type=float, default=None,
                    help="host tier (suspended requests and spilled prefix entries) as a multiple of the device cache "
                         "(default: the LLM's own default, policy.default_host_bytes)")
    add_json_arg(ap)
    args = ap.parse_args()
    if args.quick:
        args.groups, args.per_group, args.shared_len, args.new_tokens = 4, 8, 512, 32
        args.conversations, args.turns, args.max_num_seqs = 12, 4, 6
    path = checkpoint(args)
    rec = Record(args.json, "prefix_cache", args.device, vars(args))
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    longest = max(args.shared_len + 256, 64 + args.turns * (args.new_tokens + 64)) + args.new_tokens + 8
    for name in args.workloads:
        waves, warmup = workload(args, name, random.Random(0)), workload(args, name, random.Random(1), warmup=True)
        turns = args.turns if name == "multiturn" else 0
        for scale in args.cache_scale:
            run_pair(args, path, name, waves, warmup, turns, params, longest, scale, rec)
    rec.close()


def run_pair(args, path, name: str, waves, warmup_waves, turns: int, params: SamplingParams, longest: int,
             scale: float, rec: Record) -> None:
    """One workload with caching off, then on, at `scale` times the LLM's default device cache (each its own
    engine; with --warmup each first runs `warmup_waves` untimed, then forgets what it cached)."""
    figures = {}
    for on in (False, True):
        kw = dict(device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs, page_size=args.page_size,
                  max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=longest, enable_prefix_caching=on)
        llm = LLM(path, **kw)
        if scale != 1.0 or args.host_scale is not None:
            device = int(llm.manager.config.device_bytes * scale)
            host = None if args.host_scale is None else int(device * args.host_scale)
            llm = LLM(path, **kw, device_cache_bytes=device, host_cache_bytes=host)
        interval = llm.manager.planner.prefix.interval if on else 1
        if args.warmup:  # compiling, autotuning and graph capture at the workload's shapes stay out of the times
            measure(llm, warmup_waves, turns, params, seed=2)
            llm.reset_prefix_cache()
        f = measure(llm, waves, turns, params)
        if name == "shared":
            f["ceiling"] = len(waves[0]) * (args.shared_len // interval * interval)
        f["device_cache_bytes"] = llm.manager.config.device_bytes
        f["host_cache_bytes"] = llm.manager.config.host_bytes
        figures[on] = f
    off, on_ = figures[False], figures[True]
    row = {
        "workload": name, "cache_scale": scale, "host_scale": args.host_scale,
        "host_cache_bytes_on": on_["host_cache_bytes"],
        "device_cache_bytes_on": on_["device_cache_bytes"],
        "interval": interval, "hits": on_["hits"], "ceiling": on_["ceiling"],
        "hit_ratio_of_ceiling": on_["hits"] / max(on_["ceiling"], 1),
        "prefill_tokens_off": off["prefill_tokens"], "prefill_tokens_on": on_["prefill_tokens"],
        "prefill_reduction_x": off["prefill_tokens"] / max(on_["prefill_tokens"], 1),
        "ttft_mean_s_off": off["ttft_mean_s"], "ttft_mean_s_on": on_["ttft_mean_s"],
        "total_s_off": off["total_s"], "total_s_on": on_["total_s"],
        "snapshot_share_of_cache_peak": on_["snapshot_bytes_peak"] / on_["device_cache_bytes"],
        "evictions": on_["evictions"], "spills": on_["spills"], "host_hits": on_["host_hits"],
        "snapshot_rows": on_["snapshot_rows"], "outputs_equal": off["outputs"] == on_["outputs"],
    }
    rec.add(**row)
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
