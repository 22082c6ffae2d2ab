"""Resume by swap (host -> device copy of the request's pages and slot) against re-prefill (recompute the
context), on one request of a Nemotron-H-like model, for contexts of 512 to 32K tokens.

Both ways are timed to the request's next token, the cost a preempted request pays before it decodes again:
  swap:       resume (copy back) + one decode step
  re-prefill: drop the state, prefill the whole context again + one decode step
The table also gives the parts: the copy alone, the prefill alone, and a plain decode step. The whole
context prefills in one step (the token budget is set above the longest context) unless
--max-num-batched-tokens says otherwise; the `steps` column counts the prefill steps taken, so a chunked
prefill shows as such. Each figure is the median of --repeats rounds after one untimed round at the same
context (each round adds three tokens to a context of hundreds to thousands).

    PYTHONPATH=. python benchmarks/swap_vs_reprefill.py --contexts 512 2048 --repeats 2            # CPU smoke
    PYTHONPATH=. python benchmarks/swap_vs_reprefill.py --size 1b --device cuda --dtype bfloat16 \\
        --contexts 512 2048 8192 32768 --json out/swap_vs_reprefill.json
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.families import add_model_args, checkpoint, request_bytes
from benchmarks.record import Record, add_json_arg
from benchmarks.timing import REPEATS, Stopwatch, median
from hybridcache import LLM, SamplingParams
from hybridcache.cache import Status

WARMUP = 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed rounds per context (the median is reported)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="prefill token budget per step (default: the longest context in one step)")
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode steps")
    add_json_arg(ap)
    args = ap.parse_args()
    path = checkpoint(args)
    rounds = WARMUP + args.repeats
    max_tokens = 3 * rounds + 2  # each round decodes three tokens (plain, swap, re-prefill), plus the first and a spare
    longest = max(args.contexts) + max_tokens
    token_budget = args.max_num_batched_tokens or longest
    # one request, resident at its whole length (prompt + max_tokens + the one-token verify lookahead)
    budget = request_bytes(path, args.dtype, longest + 1)
    llm = LLM(path, device=args.device, dtype=args.dtype, max_num_seqs=1, max_num_batched_tokens=token_budget,
              max_model_len=longest, device_cache_bytes=budget, host_cache_bytes=budget,
              enforce_eager=args.enforce_eager)
    rec = Record(args.json, "swap_vs_reprefill", args.device, dict(
        family=args.family, size=args.size, device=args.device, dtype=args.dtype, contexts=args.contexts,
        repeats=args.repeats, max_num_batched_tokens=token_budget, device_cache_bytes=budget,
        enforce_eager=args.enforce_eager))
    print(f"{args.family} {args.size} on {args.device} {args.dtype}; prefill budget {token_budget} tokens a step; "
          f"median of {args.repeats} rounds after {WARMUP} warm-up round; times to the next token")
    print(f"{'context':>8} {'state MB':>9} {'copy ms':>8} {'swap ms':>8} {'prefill ms':>11} {'steps':>5} "
          f"{'re-prefill ms':>14} {'decode ms':>10} {'re-prefill / swap':>18}")
    gen = torch.Generator().manual_seed(0)
    for ctx in args.contexts:
        prompt = torch.randint(0, llm.vocab_size, (ctx,), generator=gen).tolist()
        r = measure(llm, prompt, max_tokens, rounds, args.device)
        row = dict(family=args.family, size=args.size, device=args.device, dtype=args.dtype, context=ctx,
                   max_num_batched_tokens=token_budget, state_bytes=r["moved"], prefill_steps=r["steps"],
                   **{f"{k}_ms": median(v[WARMUP:]) * 1e3 for k, v in r["times"].items()},
                   runs_ms={k: [t * 1e3 for t in v[WARMUP:]] for k, v in r["times"].items()})
        row["ratio"] = row["reprefill_ms"] / row["swap_ms"]
        rec.add(**row)
        print(f"{ctx:>8} {r['moved'] / 1e6:>9.1f} {row['copy_ms']:>8.2f} {row['swap_ms']:>8.2f} "
              f"{row['prefill_ms']:>11.2f} {r['steps']:>5} {row['reprefill_ms']:>14.2f} {row['decode_ms']:>10.2f} "
              f"{row['ratio']:>17.1f}x")
    rec.close()


def measure(llm: LLM, prompt: list[int], max_tokens: int, rounds: int, device: str) -> dict:
    """`rounds` rounds of (plain decode step, swap + decode step, re-prefill + decode step) on one request;
    returns every round's seconds per part, the bytes a swap moves and the prefill steps a re-prefill takes."""
    mgr, sched = llm.manager, llm.scheduler
    rid = llm.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    req = llm._loop.requests[rid]
    while mgr.status(rid) != Status.GENERATION:  # the first prefill (it samples the first token)
        llm.step()
    watch = Stopwatch(device)
    times: dict[str, list[float]] = {k: [] for k in ("decode", "copy", "swap", "prefill", "reprefill")}
    moved = steps = 0

    def decode_one() -> None:
        before = len(req.output)
        llm.step()
        assert len(req.output) == before + 1 and mgr.status(rid) == Status.GENERATION, "expected one decode step"

    for _ in range(rounds):
        watch.start()
        decode_one()
        watch.mark("decode")
        times["decode"].append(watch.read()["decode"])
        # swap: suspend to the host tier (untimed), then resume and decode
        sched.running.remove(req)  # out of the scheduler's hands while it is moved
        mgr.suspend([rid])
        mgr.synchronize()
        watch.start()
        moved = mgr.resume([rid])
        mgr.synchronize()
        watch.mark("copy")
        sched.running.append(req)
        decode_one()
        watch.mark("swap")
        marks = watch.read()
        times["copy"].append(marks["copy"])
        times["swap"].append(marks["swap"])
        # re-prefill: drop the state, recompute the context (everything but the last sampled token), decode
        mgr.reprefill(rid)
        sched.restart([rid], llm._loop.requests)
        watch.start()
        steps = 0
        while mgr.status(rid) != Status.GENERATION:
            llm.step()
            steps += 1
        watch.mark("prefill")
        decode_one()
        watch.mark("reprefill")
        marks = watch.read()
        times["prefill"].append(marks["prefill"])
        times["reprefill"].append(marks["reprefill"])
    llm.abort_request(rid)
    return dict(times=times, moved=moved, steps=steps)


if __name__ == "__main__":
    main()
