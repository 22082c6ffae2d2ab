"""Where a steady decode step's time goes: wall time per step, GPU kernel time per step (busy share),
kernel launches and host syncs per step, with CUDA graphs and eagerly, measured in one run.

    python benchmarks/step_profile.py --family nemotron_h --size 1b --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.families import add_model_args, checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def steady(llm, batch: int, prompt_len: int, vocab: int) -> None:
    from hybridcache import SamplingParams
    from hybridcache.workload import make_prompts

    for p in make_prompts(batch, vocab, seed=batch, min_len=prompt_len, max_len=prompt_len):
        llm.add_request(p, SamplingParams(max_tokens=512, ignore_eos=True))
    for _ in range(8):  # prefill, first decode steps, graph capture
        llm.step()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompt-len", type=int, default=128)
    args = ap.parse_args()
    from hybridcache import LLM

    path = checkpoint(args)
    print(f"{args.family} {args.size} on {args.device} {args.dtype}; {args.steps} steady decode steps")
    print(f"{'batch':>5} {'mode':>6} {'wall ms':>8} {'GPU ms':>7} {'busy':>6} {'launches':>9} {'tok/s':>8}")
    for b in args.batch:
        for eager in (False, True):
            llm = LLM(path, device=args.device, dtype=args.dtype, max_num_seqs=b, max_model_len=args.prompt_len + 1024,
                      max_num_batched_tokens=b * args.prompt_len, enforce_eager=eager)
            steady(llm, b, args.prompt_len, llm.vocab_size)
            sync(args.device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                llm.step()
            sync(args.device)
            wall = (time.perf_counter() - t0) / args.steps
            cuda = args.device.startswith("cuda")
            with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
                for _ in range(args.steps):
                    llm.step()
                sync(args.device)
            kernels = [e for e in prof.events() if cuda and e.device_type == torch.autograd.DeviceType.CUDA]
            gpu = sum(e.device_time for e in kernels) / 1e3 / args.steps  # us -> ms
            print(f"{b:>5} {'eager' if eager else 'graph':>6} {wall * 1e3:>8.2f} {gpu:>7.2f} {gpu / (wall * 1e3):>5.0%} "
                  f"{len(kernels) / args.steps:>9.0f} {b / wall:>8.0f}")
            del llm
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
