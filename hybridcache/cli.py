"""hybridcache command line.

  run       the main job: the embedded default model, a workload under memory pressure with speculative
            decoding, checked against an unconstrained run without speculation
  generate  prompts (text or token ids) against any checkpoint directory
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def default_model_dir() -> Path:
    root = Path(os.environ.get("HYBRIDCACHE_HOME", Path.home() / ".cache" / "hybridcache"))
    return root / "default-nemotron-h"


def ensure_default_model(path: Path) -> Path:
    """Build the default checkpoint once; rebuild when its recipe (config, seed, transformers) changes."""
    import json

    import transformers

    from .models import default

    recipe = json.dumps([default.DEFAULT_CONFIG, default.SEED, default.LM_HEAD_SCALE, transformers.__version__],
                        sort_keys=True)
    stamp = path / "RECIPE"
    if not stamp.exists() or stamp.read_text() != recipe:
        default.build_default_checkpoint(path)
        stamp.write_text(recipe)
    return path


def cmd_run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from . import LLM, SamplingParams, SpeculativeConfig
    from .cache import sizing_of
    from .workload import make_prompts

    torch.manual_seed(0)
    if args.device == "cpu" and not args.model:
        torch.set_num_threads(1)  # the default model is tiny: more threads only contend
    model_dir = Path(args.model) if args.model else ensure_default_model(default_model_dir())
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    spec = SpeculativeConfig(method="ngram", num_draft_tokens=args.num_draft_tokens)
    reference = LLM(model_dir, device=args.device, max_num_seqs=args.num_requests, speculative=None,
                    max_num_batched_tokens=4096)
    prompts = make_prompts(args.num_requests, reference.vocab_size, seed=args.seed)
    longest = max(map(len, prompts)) + args.max_tokens + args.num_draft_tokens + 1
    model = reference.model  # the speculative run's cache is sized from the same layers, with drafts
    sizing = sizing_of(model.state_modules(args.num_draft_tokens), model.page_roles(16))
    # a slot for every sequence but pages for about a third of the batch at full length: growth forces
    # suspensions; a host tier of a few requests forces re-prefills too
    per_request = sizing.request_bytes(longest, 16)
    page_bytes = per_request - sizing.bytes_per_slot
    device_bytes = args.max_num_seqs * sizing.bytes_per_slot + int(page_bytes * max(2, args.max_num_seqs / 3))
    host_bytes = int(per_request * args.host_requests)
    llm = LLM(model_dir, device=args.device, max_num_seqs=args.max_num_seqs, speculative=spec,
              device_cache_bytes=device_bytes, host_cache_bytes=host_bytes, max_num_batched_tokens=256,
              num_slots=args.max_num_seqs)
    bar = tqdm(total=len(prompts), desc="requests", unit="req", disable=args.quiet)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, progress=lambda done, total: bar.update(done - bar.n))
    elapsed = time.perf_counter() - t0
    bar.close()
    tokens = sum(len(o.token_ids) for o in outs)

    ref = reference.generate(prompts, params)
    same = sum(o.token_ids == r.token_ids for o, r in zip(outs, ref))
    s = llm.stats
    rate = s.num_accepted_tokens / max(s.num_draft_tokens, 1)
    print(f"model               {model_dir}")
    print(f"device budget       {device_bytes / 1e6:.2f} MB ({llm.manager.num_slots} slots, {llm.manager.num_pages} pages); "
          f"host {host_bytes / 1e6:.2f} MB")
    print(f"requests            {len(outs)}")
    print(f"tokens              {tokens}")
    print(f"tokens/s            {tokens / elapsed:.1f}  ({elapsed:.2f} s, {s.num_steps} steps)")
    print(f"suspensions         {s.num_suspensions}")
    print(f"resumes             {s.num_resumes}")
    print(f"re-prefills         {s.num_reprefills}")
    print(f"bytes moved         {s.bytes_to_host} to host, {s.bytes_to_device} to device")
    print(f"draft acceptance    {s.num_accepted_tokens}/{s.num_draft_tokens} = {rate:.1%}")
    print(f"equal to the unconstrained run without speculation: {same}/{len(outs)} "
          f"{'yes' if same == len(outs) else 'NO'}")
    llm.manager.check_integrity()
    return 0 if same == len(outs) else 1


def cmd_generate(args: argparse.Namespace) -> int:
    from . import LLM, SamplingParams, SpeculativeConfig

    spec = SpeculativeConfig(num_draft_tokens=args.num_draft_tokens) if args.num_draft_tokens else None
    llm = LLM(args.model, device=args.device, dtype=args.dtype, speculative=spec)
    prompts: list = [[int(t) for t in p.split(",")] for p in args.token_ids] if args.token_ids else list(args.prompt)
    if not prompts:
        print("give --prompt TEXT or --token-ids 1,2,3", file=sys.stderr)
        return 2
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos)
    for out in llm.generate(prompts, params):
        print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridcache", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="the main job on the embedded default model")
    run.add_argument("--model", help="checkpoint directory (default: the embedded tiny Nemotron-H, built once)")
    run.add_argument("--device", default="cpu")
    run.add_argument("--num-requests", type=int, default=24)
    run.add_argument("--max-tokens", type=int, default=48)
    run.add_argument("--max-num-seqs", type=int, default=8)
    run.add_argument("--num-draft-tokens", type=int, default=3)
    run.add_argument("--host-requests", type=float, default=3, help="host tier size, in full-length requests")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(fn=cmd_run)

    gen = sub.add_parser("generate", help="generate from prompts against a checkpoint directory")
    gen.add_argument("--model", required=True)
    gen.add_argument("--prompt", action="append", default=[], help="a text prompt (needs a tokenizer); repeatable")
    gen.add_argument("--token-ids", action="append", default=[], help="comma-separated token ids; repeatable")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--num-draft-tokens", type=int, default=0, help="n-gram speculation with k drafts (0: off)")
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="float32")
    gen.set_defaults(fn=cmd_generate)

    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
