"""Engine throughput against transformers' `generate` on the same checkpoint and prompts.

Builds a random checkpoint of the family (saved once under --dir), then times, in one run:
  hybridcache:  LLM.generate on the prompts (greedy); with --engines ngram also with n-gram speculation
  transformers: model.generate on the same batch (greedy, its torch paths; equal-length prompts, no padding)

tok/s = generated tokens / wall time of the whole generate call (prefill included, for both), the median
of --repeats runs after one untimed run of the same batch (same prompts, same lengths). decode tok/s = the
tokens after the first / (median time of the whole call - median time of the same call with max_tokens=1),
timed alike for both engines: the steady decode rate, without the prefill and the first token. Every request of
the batch is resident: the device cache holds batch x device_bytes_needed(prompt + max_tokens + lookahead),
and the whole batch's prompts prefill in one step (like transformers); each row records the suspensions,
re-prefills and rebalances it saw (all 0 when that held).

    PYTHONPATH=. python benchmarks/engine_throughput.py --family nemotron_h --size tiny --repeats 2   # CPU smoke
    PYTHONPATH=. python benchmarks/engine_throughput.py --family qwen3_next --size 1b --device cuda --dtype bfloat16 \\
        --batch 1 16 64 --hf-batches 1 16 --json out/engine_throughput-qwen3_next.json

Also prints the speculative state bytes per request: the replay history (what hybridcache keeps)
against per-token intermediate states (k + 1 copies of the recurrent state and conv window).
"""
from __future__ import annotations

import argparse
import os

import torch

from benchmarks.families import add_model_args, checkpoint, request_bytes
from benchmarks.record import Record, add_json_arg
from benchmarks.timing import REPEATS, decode_rate, median, time_runs
from hybridcache.cache import sizing_of

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ENGINES = {"hybridcache": 0, "ngram": None}  # name -> draft tokens (None: --num-draft-tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--engines", nargs="+", choices=sorted(ENGINES), default=["hybridcache", "ngram"])
    ap.add_argument("--num-draft-tokens", type=int, default=3, help="k of the ngram engine")
    ap.add_argument("--hf-batches", type=int, nargs="*", default=None,
                    help="batches to time transformers at (default: every --batch; none when given empty)")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed runs per figure (the median is reported)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="scheduler token budget per step (default: max batch x prompt len, one prefill step)")
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode steps")
    add_json_arg(ap)
    args = ap.parse_args()
    from hybridcache import LLM, SamplingParams, SpeculativeConfig
    from hybridcache.workload import make_prompts

    path = checkpoint(args)
    hf_batches = args.batch if args.hf_batches is None else args.hf_batches
    max_batch = max(args.batch)
    token_budget = args.max_num_batched_tokens or max(max_batch * args.prompt_len, 512)
    rec = Record(args.json, "engine_throughput", args.device, dict(
        family=args.family, size=args.size, device=args.device, dtype=args.dtype, batches=args.batch,
        hf_batches=hf_batches, prompt_len=args.prompt_len, max_tokens=args.max_tokens, repeats=args.repeats,
        max_num_batched_tokens=token_budget, enforce_eager=args.enforce_eager))
    engines: dict[str, tuple[object, int]] = {}
    for name in args.engines:
        k = ENGINES[name] if ENGINES[name] is not None else args.num_draft_tokens
        label = "hybridcache" if k == 0 else f"hybridcache+ngram(k={k})"
        need = request_bytes(path, args.dtype, args.prompt_len + args.max_tokens + k + 1, k)
        engines[label] = (LLM(path, device=args.device, dtype=args.dtype, max_num_seqs=max_batch,
                              max_num_batched_tokens=token_budget, device_cache_bytes=max_batch * need,
                              max_model_len=args.prompt_len + args.max_tokens,
                              speculative=SpeculativeConfig(num_draft_tokens=k) if k else None,
                              enforce_eager=args.enforce_eager), k)
    hf = None
    if hf_batches:
        from transformers import AutoModelForCausalLM

        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    print(f"{args.family} {args.size} on {args.device} {args.dtype}; prompt {args.prompt_len}, "
          f"{args.max_tokens} new tokens; median of {args.repeats} runs after a warm-up run")
    first = next(iter(engines.values()))[0]
    rec.extra("spec_state_bytes", state_bytes(first.model))
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    first_params = SamplingParams(max_tokens=1, ignore_eos=True)
    base = dict(family=args.family, size=args.size, device=args.device, dtype=args.dtype,
                prompt_len=args.prompt_len, max_tokens=args.max_tokens)
    print(f"{'batch':>5} {'engine':>24} {'tok/s':>9} {'median s':>9} {'decode tok/s':>11} {'vs transformers':>16}")
    for b in args.batch:
        prompts = make_prompts(b, first.vocab_size, seed=b, min_len=args.prompt_len, max_len=args.prompt_len)
        rates, decode = {}, {}
        for label, (llm, k) in engines.items():
            def run() -> None:
                outs = llm.generate(prompts, params)
                assert all(len(o.token_ids) == args.max_tokens for o in outs), "every request runs max_tokens"

            def first_token() -> None:
                llm.generate(prompts, first_params)

            first_runs = time_runs(first_token, args.device, args.repeats)
            before = counters(llm)
            runs = time_runs(run, args.device, args.repeats)
            after = counters(llm)
            seen = {key: after[key] - before[key] for key in after}
            tokens = b * args.max_tokens
            rates[label] = tokens / median(runs)
            decode[label] = decode_rate(b, args.max_tokens, runs, first_runs)
            row = dict(base, batch=b, engine=label, num_draft_tokens=k, tokens=tokens, median_s=median(runs),
                       runs_s=runs, tok_per_s=rates[label], first_token_s=median(first_runs),
                       decode_tok_per_s=decode[label], num_slots=llm.manager.num_slots,
                       num_pages=llm.manager.num_pages, device_cache_bytes=llm.manager.config.device_bytes,
                       max_num_batched_tokens=token_budget, enforce_eager=args.enforce_eager,
                       suspensions=seen["suspensions"],
                       reprefills=seen["reprefills"], rebalances=seen["rebalances"],
                       steps_per_run=seen["steps"] / (args.repeats + 1))
            if k:
                row["accepted_per_draft"] = seen["accepted"] / max(seen["drafted"], 1)
            rec.add(**row)
            print(f"{b:>5} {label:>24} {rates[label]:>9.1f} {median(runs):>9.3f} {decode[label]:>11.1f}   ({llm.manager.num_slots} slots, "
                  f"{llm.manager.num_pages} pages; {seen['suspensions']} suspensions, {seen['reprefills']} "
                  f"re-prefills, {seen['rebalances']} rebalances)")
        if hf is not None and b in hf_batches:
            ids = torch.tensor(prompts, device=args.device)
            gen_kw = dict(max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens, do_sample=False,
                          pad_token_id=0)
            def hf_run() -> None:
                with torch.inference_mode():
                    out = hf.generate(ids, **gen_kw)
                assert out.shape == (b, args.prompt_len + args.max_tokens), "every row generates max_tokens"

            def hf_first() -> None:
                with torch.inference_mode():
                    hf.generate(ids, **dict(gen_kw, max_new_tokens=1, min_new_tokens=1))

            first_runs = time_runs(hf_first, args.device, args.repeats)
            runs = time_runs(hf_run, args.device, args.repeats)
            hf_rate = b * args.max_tokens / median(runs)
            hf_decode = decode_rate(b, args.max_tokens, runs, first_runs)
            rec.add(**base, batch=b, engine="transformers", num_draft_tokens=0, tokens=b * args.max_tokens,
                    median_s=median(runs), runs_s=runs, tok_per_s=hf_rate, first_token_s=median(first_runs),
                    decode_tok_per_s=hf_decode)
            print(f"{b:>5} {'transformers':>24} {hf_rate:>9.1f} {median(runs):>9.3f} {hf_decode:>11.1f} {1.0:>15.2f}x")
            for label, rate in rates.items():
                print(f"{b:>5} {label:>24} {'':>9} {'':>9} {'':>11} {rate / hf_rate:>15.2f}x "
                      f"(decode {decode[label] / hf_decode:.2f}x)")
    rec.close()


def counters(llm) -> dict[str, int]:
    s = llm.stats
    return dict(suspensions=s.num_suspensions, reprefills=s.num_reprefills, rebalances=s.num_rebalances,
                steps=s.num_steps, drafted=s.num_draft_tokens, accepted=s.num_accepted_tokens)


def state_bytes(model) -> list[dict]:
    """Recurrent bytes per request beyond the plain state: replay history vs per-token states."""
    plain = sizing_of(model.state_modules(0), None).bytes_per_slot
    out = []
    for k in (3, 7):
        replay = sizing_of(model.state_modules(k), None).bytes_per_slot
        per_token = (k + 1) * plain
        out.append(dict(k=k, plain_bytes=plain, replay_bytes=replay, per_token_bytes=per_token))
        print(f"spec state per request, k={k}: replay {replay / 1e6:.2f} MB, per-token states "
              f"{per_token / 1e6:.2f} MB ({per_token / replay:.1f}x); plain {plain / 1e6:.2f} MB")
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
