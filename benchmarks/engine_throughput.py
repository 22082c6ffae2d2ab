"""Engine throughput against transformers' `generate` on the same checkpoint and prompts, as a ratio.

Builds a random checkpoint of the family (saved once under --dir), then times, in one run:
  transformers: model.generate on a padded batch (greedy, its torch paths)
  hybridcache:  LLM.generate on the same prompts (greedy), with and without n-gram speculation

    python benchmarks/engine_throughput.py --family nemotron_h --size tiny      # CPU
    python benchmarks/engine_throughput.py --family qwen3_next --size 1b --device cuda --dtype bfloat16

Also prints the speculative state bytes per request: the replay history (what hybridcache keeps)
against per-token intermediate states (k + 1 copies of the recurrent state and conv window).
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from benchmarks.families import add_model_args, checkpoint
from hybridcache.cache import sizing_of

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from hybridcache import LLM, SamplingParams, SpeculativeConfig
    from hybridcache.workload import make_prompts

    path = checkpoint(args)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    vocab = hf.config.vocab_size
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    max_len = args.prompt_len + args.max_tokens + 16
    engines = {
        "hybridcache": LLM(path, device=args.device, dtype=args.dtype, max_num_seqs=max(args.batch),
                           max_num_batched_tokens=4096, max_model_len=max_len),
        "hybridcache+ngram(k=3)": LLM(path, device=args.device, dtype=args.dtype, max_num_seqs=max(args.batch),
                                      max_num_batched_tokens=4096, speculative=SpeculativeConfig(num_draft_tokens=3),
                                      max_model_len=max_len),
    }
    print(f"{args.family} {args.size} on {args.device} {args.dtype}; prompt {args.prompt_len}, "
          f"{args.max_tokens} new tokens")
    state_bytes(engines["hybridcache"].model)
    print(f"{'batch':>5} {'engine':>24} {'tok/s':>9} {'vs transformers':>16}")
    for b in args.batch:
        prompts = make_prompts(b, vocab, seed=b, min_len=args.prompt_len, max_len=args.prompt_len)
        ids = torch.tensor(prompts, device=args.device)
        gen_kw = dict(max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens, do_sample=False, pad_token_id=0)
        with torch.inference_mode():
            hf.generate(ids[:, :8], max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
            sync(args.device)
            t0 = time.perf_counter()
            hf.generate(ids, **gen_kw)
            sync(args.device)
        hf_rate = b * args.max_tokens / (time.perf_counter() - t0)
        print(f"{b:>5} {'transformers':>24} {hf_rate:>9.1f} {1.0:>15.2f}x")
        for name, llm in engines.items():
            llm.generate(prompts[:1], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
            sync(args.device)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params)
            sync(args.device)
            rate = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)
            split = f"{llm.manager.num_slots} slots, {llm.manager.num_pages} pages, {llm.stats.num_rebalances} rebalances"
            print(f"{b:>5} {name:>24} {rate:>9.1f} {rate / hf_rate:>15.2f}x   ({split})")


def state_bytes(model) -> None:
    """Recurrent bytes per request beyond the plain state: replay history vs per-token states."""
    plain = sizing_of(model.state_modules(0), None).bytes_per_slot
    for k in (3, 7):
        replay = sizing_of(model.state_modules(k), None).bytes_per_slot
        per_token = (k + 1) * plain
        print(f"spec state per request, k={k}: replay {replay / 1e6:.2f} MB, per-token states "
              f"{per_token / 1e6:.2f} MB ({per_token / replay:.1f}x); plain {plain / 1e6:.2f} MB")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
