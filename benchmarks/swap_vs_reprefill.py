"""Resume by swap (host -> device copy of the request's pages and slot) against re-prefill (recompute the
context), for contexts of 512 to 8K tokens, on one request of a Nemotron-H-like model.

    python benchmarks/swap_vs_reprefill.py --size 1b --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.engine_throughput import sync
from benchmarks.families import add_model_args, checkpoint
from hybridcache import LLM, SamplingParams
from hybridcache.cache import Status


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    args = ap.parse_args()
    path = checkpoint(args)
    llm = LLM(path, device=args.device, dtype=args.dtype, max_num_seqs=2, max_num_batched_tokens=16384,
              max_model_len=max(args.contexts) + 64)
    mgr, sched = llm.manager, llm.scheduler
    print(f"{args.family} {args.size} on {args.device} {args.dtype}")
    print(f"{'context':>8} {'state MB':>9} {'swap-in ms':>11} {'re-prefill ms':>14} {'re-prefill / swap':>18}")
    for ctx in args.contexts:
        prompt = torch.randint(0, 1000, (ctx,)).tolist()
        rid = llm.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
        req = llm._requests[rid]
        while mgr.status(rid) != Status.GENERATION:
            llm.step()
        # swap: suspend to the host tier, then time the resume (copy back, ready for the next forward)
        sched.running.remove(req)  # out of the scheduler's hands while it is timed
        mgr.suspend([rid])
        mgr.synchronize()
        sync(args.device)
        t0 = time.perf_counter()
        moved = mgr.resume([rid])
        mgr.synchronize()
        t_swap = time.perf_counter() - t0
        sched.running.append(req)
        # re-prefill: drop the state and recompute the same context
        mgr.reprefill(rid)
        sched.restart([rid], llm._requests)
        sync(args.device)
        t0 = time.perf_counter()
        while mgr.status(rid) != Status.GENERATION:
            llm.step()
        sync(args.device)
        t_pre = time.perf_counter() - t0
        while llm.has_unfinished():
            llm.step()
        print(f"{ctx:>8} {moved / 1e6:>9.1f} {t_swap * 1e3:>11.2f} {t_pre * 1e3:>14.2f} {t_pre / t_swap:>17.1f}x")


if __name__ == "__main__":
    main()
