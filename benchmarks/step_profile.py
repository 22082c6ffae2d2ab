"""Where a steady decode step's time goes: wall time per step, GPU kernel time per step (busy share),
kernel launches and host syncs per step, with CUDA graphs and eagerly, measured in one run.

With graphs, `replay ms` is the step's graph replayed back to back alone (CUDA events, no host work
between): wall - replay is the host's share of a step, replay - GPU the gaps between the graph's kernels.
(The replays rerun the last step on its slots, so the engine is discarded after.)

    python benchmarks/step_profile.py --family nemotron_h --size 1b --device cuda --dtype bfloat16
    python benchmarks/step_profile.py ... --by-module     # also: kernels and their time per layer kind
                                                          # (graph modes: the kernels taking the most time,
                                                          # kept in the JSON row as `kernels`)

`--by-module` profiles one eager step (the graph replays the same kernels) with a profiler range around
every leaf-most module's forward, and charges each kernel to the innermost module that launched it
(`engine` outside the model: sampling, uploads). On a CPU the counts are of aten ops, not kernels.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.families import add_model_args, checkpoint
from benchmarks.record import Record, add_json_arg

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# (name, enforce_eager, async_scheduling, draft tokens): graphs with the host's planning overlapped, graphs
# with a synchronous step (the host plans while the device idles), eager; `verify`: every step a k=3 verify
# (graphs, asynchronous: drafted on the device), each row proposing 3 tokens the model does not pick;
# `verify-sync`: the same, synchronous (the host drafts from the tokens read back); `spec-idle`: the speculative
# engine (k=3) with every row backing off for good (what zero acceptance mostly runs: after one read, plain
# steps); `spec-chain`: every row backing off for a short pause, held there (one-token steps chained on the
# verify steps in flight, what the pauses up to `async_verify.LEAVE_CHAIN_AFTER` steps run)
MODES = [("graph", False, True, 0), ("graph-sync", False, False, 0), ("eager", True, True, 0), ("verify", False, True, 3),
         ("verify-sync", False, False, 3), ("spec-idle", False, True, 3), ("spec-chain", False, True, 3)]


def idle_steps(mode: str) -> int:
    """How many steps `mode` holds every row backing off (`steady_engine`)."""
    from hybridcache.engine.async_verify import LEAVE_CHAIN_AFTER

    return {"spec-idle": 1 << 30, "spec-chain": LEAVE_CHAIN_AFTER + 1}.get(mode, 0)


def never_picked(tokens: list[int]) -> list[int]:
    """Three drafts the greedy choice rarely is (a row's last token, repeated)."""
    return [tokens[-1]] * 3


def never_picked_on_device(history: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`never_picked` for an asynchronous verify step: history [R, W] -> drafts [R, 3], 3 proposed each."""
    last = history.gather(1, (lengths - 1)[:, None])
    return last.expand(-1, 3).contiguous(), torch.full_like(lengths, 3)


def steady(llm, batch: int, prompt_len: int, vocab: int) -> None:
    from hybridcache import SamplingParams
    from hybridcache.workload import make_prompts

    for p in make_prompts(batch, vocab, seed=batch, min_len=prompt_len, max_len=prompt_len):
        llm.add_request(p, SamplingParams(max_tokens=512, ignore_eos=True))
    for _ in range(8):  # prefill, first decode steps, graph capture
        llm.step()


def steady_engine(path, device: str, dtype: str, batch: int, prompt_len: int, max_model_len: int, k: int,
                  idle: int = 0, eager: bool = False, overlap: bool = True):
    """An LLM in steady decode of `batch` rows of `prompt_len` tokens; with `k` drafts a row that the model
    does not pick (`never_picked`, back-off off); `idle` > 0: every row then backs off that many steps (its
    DraftBackoff state set directly), set again after every step, and the steps with drafts still in flight
    run, so each step is one token (`idle_steps`)."""
    from hybridcache import LLM, SpeculativeConfig

    llm = LLM(path, device=device, dtype=dtype, max_num_seqs=batch, max_model_len=max_model_len,
              max_num_batched_tokens=batch * prompt_len, enforce_eager=eager, async_scheduling=overlap,
              speculative=SpeculativeConfig(num_draft_tokens=k, backoff_max_steps=0) if k else None)
    if k:
        llm.drafter.propose, llm.drafter.propose_on_device = never_picked, never_picked_on_device
    steady(llm, batch, prompt_len, llm.vocab_size)
    if idle:
        def hold() -> None:
            for req in llm._loop.requests.values():
                req.draft_skip = idle

        hold()
        llm.step_hook = hold
        for _ in range(4):  # the steps with drafts in flight, and the one-token graphs' capture
            llm.step()
    return llm


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def by_module(llm, device: str, steps: int) -> None:
    """Kernels per step and their time, by the innermost module kind that launched them."""
    model = llm.runner.model
    ranges: list = []
    hooks = []
    for name, module in model.named_modules():
        if module is model:
            continue
        kind = type(module).__name__

        def enter(mod, args, kind=kind):
            ranges.append(torch.profiler.record_function(f"module::{kind}"))
            ranges[-1].__enter__()

        def leave(mod, args, out):
            ranges.pop().__exit__(None, None, None)

        hooks += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    cuda = device.startswith("cuda")
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(steps):
            llm.step()
        sync(device)
    for hook in hooks:
        hook.remove()
    counts = _charge_cuda(prof) if cuda else _charge_cpu(prof)
    total = sum(ms for _, ms in counts.values()) or 1.0
    unit = "kernels, GPU ms" if cuda else "aten ops, CPU ms"
    print(f"  per step, by module kind ({unit}, share of the time):")
    for kind, (count, ms) in sorted(counts.items(), key=lambda kv: -kv[1][1]):
        print(f"    {kind:28} {count / steps:7.0f} {ms / steps:8.3f}   {ms / total:5.1%}")
    if cuda:
        print_kernels(top_kernels(prof, steps))


def top_kernels(prof, steps: int, rows: int = 25) -> list[list]:
    """The kernels that take the most GPU time per step, by name (a graph's replayed kernels included):
    [[name, launches a step, GPU ms a step], ...], most time first."""
    by_name: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("module::"):
            entry = by_name.setdefault(e.name[:70], [0, 0.0])
            entry[0] += 1
            entry[1] += e.device_time / 1e3
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:rows]
    return [[name, count / steps, ms / steps] for name, (count, ms) in ranked]


def print_kernels(kernels: list[list]) -> None:
    print("  per step, the kernels that take the most GPU time (count, ms):")
    for name, count, ms in kernels:
        print(f"    {count:5.0f} {ms:7.3f}  {name}")


def replay_ms(llm, steps: int) -> float | None:
    """Milliseconds per replay of the last step's graph, `steps` replays back to back (after one)."""
    graphs = llm.runner.graphs
    if graphs is None or graphs.last is None:
        return None
    graph = graphs.last.graph
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def host_profile(llm, steps: int) -> None:
    """Self time per step of the host functions (Python and the torch/CUDA calls they make) over `steps`
    steps: where the host's part of a step goes."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        llm.step()
    prof.disable()
    stats = pstats.Stats(prof).stats
    rows = sorted(((tt, nc, f"{Path(fn).name}:{line}({name})") for (fn, line, name), (_, nc, tt, _, _) in stats.items()),
                  reverse=True)
    total = sum(r[0] for r in rows)
    print(f"  host self time per step: {total / steps * 1e3:.3f} ms (cProfile adds its own); the most:")
    for tt, nc, where in rows[:22]:
        print(f"    {tt / steps * 1e6:8.1f} us {nc / steps:6.1f} calls  {where}")


def _owner(spans: list[tuple[float, float, str]], at: float) -> str:
    owner = "engine"
    for start, end, kind in spans:  # innermost: the last span (by start) that holds the launch
        if start <= at <= end:
            owner = kind
    return owner


def _charge_cpu(prof) -> dict[str, list[float]]:
    spans = sorted(((e.time_range.start, e.time_range.end, e.name[len("module::"):]) for e in prof.events()
                    if e.name.startswith("module::")), key=lambda s: (s[0], -s[1]))
    counts: dict[str, list[float]] = {}
    for e in prof.events():
        if e.name.startswith("module::") or (e.cpu_parent is not None and not e.cpu_parent.name.startswith("module::")):
            continue  # the outermost aten ops only (an op's own sub-ops are not counted again)
        entry = counts.setdefault(_owner(spans, e.time_range.start), [0, 0.0])
        entry[0] += 1
        entry[1] += e.cpu_time / 1e3
    return counts


def _charge_cuda(prof) -> dict[str, list[float]]:
    """Each kernel is charged where the runtime call that launched it ran (kineto events: the kernel and its
    launch share a CUPTI correlation id)."""
    events = prof.profiler.kineto_results.events()
    cuda = torch.autograd.DeviceType.CUDA
    spans = sorted(((e.start_ns(), e.start_ns() + e.duration_ns(), e.name()[len("module::"):]) for e in events
                    if e.device_type() != cuda and e.name().startswith("module::")), key=lambda s: (s[0], -s[1]))
    launches = {e.correlation_id(): e.start_ns() for e in events
                if e.device_type() != cuda and "aunch" in e.name() and e.correlation_id()}
    counts: dict[str, list[float]] = {}
    for e in events:
        if e.device_type() != cuda or e.name().startswith("module::"):  # the ranges' own GPU annotations
            continue
        entry = counts.setdefault(_owner(spans, launches.get(e.correlation_id(), -1)), [0, 0.0])
        entry[0] += 1
        entry[1] += e.duration_ns() / 1e6
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompt-len", type=int, default=128)
    add_json_arg(ap)
    ap.add_argument("--by-module", action="store_true", help="eager steps: kernels and time per layer kind")
    ap.add_argument("--host-profile", action="store_true",
                    help="also: the host functions that take the most self time per step (cProfile, each mode)")
    ap.add_argument("--modes", nargs="+", choices=[m[0] for m in MODES], default=[m[0] for m in MODES])
    args = ap.parse_args()
    path = checkpoint(args)
    record = Record(args.json, "step_profile", args.device, dict(family=args.family, size=args.size, dtype=args.dtype,
                                                               steps=args.steps, prompt_len=args.prompt_len))
    print(f"{args.family} {args.size} on {args.device} {args.dtype}; {args.steps} steady decode steps")
    print(f"{'batch':>5} {'mode':>10} {'wall ms':>8} {'GPU ms':>7} {'busy':>6} {'launches':>9} {'tok/s':>8} "
          f"{'replay ms':>9} {'host share':>10}")
    for b in args.batch:
        for mode, eager, overlap, k in (m for m in MODES if m[0] in args.modes):
            llm = steady_engine(path, args.device, args.dtype, b, args.prompt_len, args.prompt_len + 1024, k,
                                idle_steps(mode), eager, overlap)
            sync(args.device)
            t0, generated = time.perf_counter(), llm.stats.num_generated_tokens
            for _ in range(args.steps):
                llm.step()
            sync(args.device)
            wall = (time.perf_counter() - t0) / args.steps
            per_step = (llm.stats.num_generated_tokens - generated) / args.steps if k else b
            cuda = args.device.startswith("cuda")
            with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
                for _ in range(args.steps):
                    llm.step()
                sync(args.device)
            kernels = [e for e in prof.events() if cuda and e.device_type == torch.autograd.DeviceType.CUDA]
            gpu = sum(e.device_time for e in kernels) / 1e3 / args.steps  # us -> ms
            if args.host_profile:
                host_profile(llm, args.steps)  # before the replays below, which rerun a step on its slots
            replay = replay_ms(llm, args.steps) if cuda and not eager else None
            top = top_kernels(prof, args.steps) if args.by_module and cuda and not eager else None
            record.add(batch=b, mode=mode, wall_ms=wall * 1e3, gpu_ms=gpu, launches=len(kernels) / args.steps,
                       tok_s=per_step / wall, replay_ms=replay, **({"kernels": top} if top else {}))
            extra = "" if replay is None else f" {replay:>9.2f} {1 - replay / (wall * 1e3):>10.0%}"
            print(f"{b:>5} {mode:>10} {wall * 1e3:>8.2f} {gpu:>7.2f} {gpu / (wall * 1e3):>5.0%} "
                  f"{len(kernels) / args.steps:>9.0f} {per_step / wall:>8.0f}{extra}")
            if eager and args.by_module:
                by_module(llm, args.device, min(args.steps, 5))
            elif top:
                print_kernels(top)
            del llm
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    record.close()


if __name__ == "__main__":
    main()
