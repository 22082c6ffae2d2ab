"""`hybridcache generate`: prompts (text or token ids) against any checkpoint directory."""
from __future__ import annotations

import argparse

from .args import (DTYPE_CHOICES, add_parallel_flags, byte_count, float_at_least, int_at_least, probability, seed,
                   token_ids)
from .errors import UsageError
from .models import check_device, check_model, default_model_dir, ensure_default_model


def add_generate_command(sub: argparse._SubParsersAction) -> None:
    gen = sub.add_parser("generate", help="generate from prompts against a checkpoint directory")
    gen.add_argument("--model", help="checkpoint directory (default: the embedded tiny Nemotron-H, built once)")
    gen.add_argument("--prompt", action="append", default=[], help="a text prompt (needs a tokenizer); repeatable")
    gen.add_argument("--token-ids", action="append", type=token_ids, default=[],
                     help="comma-separated token ids; repeatable")
    gen.add_argument("--max-tokens", type=int_at_least(1), default=32, help="tokens generated per prompt")
    gen.add_argument("--temperature", type=float_at_least(0.0), default=0.0, help="0: greedy")
    gen.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling; 1: off")
    gen.add_argument("--top-k", type=int_at_least(0), default=0, help="0: off")
    gen.add_argument("--seed", type=seed, default=None, help="default: one per request, from the engine seed")
    gen.add_argument("--ignore-eos", action="store_true", help="generate max-tokens even past eos")
    gen.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    gen.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES, help="weights and activations")
    cache = gen.add_argument_group("cache and batching")
    cache.add_argument("--num-draft-tokens", type=int_at_least(0), default=0,
                       help="n-gram speculation with k drafts (0: off)")
    cache.add_argument("--max-num-seqs", type=int_at_least(1), default=8, help="requests running at once")
    cache.add_argument("--max-num-batched-tokens", type=int_at_least(1), default=512, help="tokens per step")
    cache.add_argument("--max-model-len", type=int_at_least(1), default=None,
                       help="longest prompt + output (default: the config's max_position_embeddings)")
    cache.add_argument("--device-cache-bytes", type=byte_count, default=None,
                       help="device budget for slots and pages, e.g. 64M (default: max-num-seqs full-length requests)")
    cache.add_argument("--host-cache-bytes", type=byte_count, default=None,
                       help="host tier for suspended requests, e.g. 256M (default: as large as the device budget)")
    cache.add_argument("--page-size", type=int_at_least(1), default=16, help="tokens per attention page")
    cache.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    add_parallel_flags(cache)
    gen.set_defaults(fn=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from .. import LLM, SamplingParams, SpeculativeConfig

    # everything the command line says is checked before the model loads (seconds for a real checkpoint)
    if bool(args.token_ids) == bool(args.prompt):
        raise UsageError("give --prompt TEXT or --token-ids 1,2,3 (repeatable), not both")
    prompts: list = args.token_ids or args.prompt
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, ignore_eos=args.ignore_eos)
    spec = SpeculativeConfig(num_draft_tokens=args.num_draft_tokens) if args.num_draft_tokens else None
    check_device(args.device)
    model_dir = args.model or ensure_default_model(default_model_dir())
    config = check_model(model_dir)
    vocab = config.get("vocab_size")
    bad = [t for ids in args.token_ids for t in ids if isinstance(vocab, int) and t >= vocab]
    if bad:
        raise UsageError(f"--token-ids: {bad[0]} is outside the vocabulary [0, {vocab})")
    llm = LLM(model_dir, device=args.device, dtype=args.dtype, speculative=spec, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
              device_cache_bytes=args.device_cache_bytes, host_cache_bytes=args.host_cache_bytes,
              page_size=args.page_size, enforce_eager=args.enforce_eager,
              tensor_parallel_size=args.tensor_parallel_size,
              pipeline_parallel_size=args.pipeline_parallel_size)
    try:
        for out in llm.generate(prompts, params):
            print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
    finally:
        llm.close()  # stops tensor-parallel workers
    return 0
