"""`hybridcache run`: the embedded default model, a workload under memory pressure with speculative decoding,
checked against an unconstrained run without speculation."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from .args import add_parallel_flags, float_at_least, int_at_least, seed
from .models import check_device, check_model, default_model_dir, ensure_default_model


def add_run_command(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="the main job on the embedded default model")
    run.add_argument("--model", help="checkpoint directory (default: the embedded tiny Nemotron-H, built once)")
    run.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    run.add_argument("--num-requests", type=int_at_least(1), default=24, help="requests in the workload")
    run.add_argument("--max-tokens", type=int_at_least(1), default=48, help="tokens generated per request")
    run.add_argument("--max-num-seqs", type=int_at_least(1), default=8, help="requests running at once")
    run.add_argument("--num-draft-tokens", type=int_at_least(1), default=3, help="n-gram drafts per step")
    run.add_argument("--host-requests", type=float_at_least(0.0), default=3.0,
                     help="host tier size, in full-length requests")
    run.add_argument("--seed", type=seed, default=0, help="seed of the workload's prompts")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    add_parallel_flags(run)
    run.set_defaults(fn=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from .. import LLM, SamplingParams, SpeculativeConfig
    from ..cache import sizing_of
    from ..workload import make_prompts

    torch.manual_seed(0)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    spec = SpeculativeConfig(method="ngram", num_draft_tokens=args.num_draft_tokens)
    check_device(args.device)
    model_dir = Path(args.model) if args.model else ensure_default_model(default_model_dir())
    check_model(model_dir)  # the LLM picks torch threads for a tiny model on the CPU
    reference = LLM(model_dir, device=args.device, max_num_seqs=args.num_requests, speculative=None,
                    max_num_batched_tokens=4096, tensor_parallel_size=args.tensor_parallel_size,
                    pipeline_parallel_size=args.pipeline_parallel_size)
    prompts = make_prompts(args.num_requests, reference.vocab_size, seed=args.seed)
    longest = max(map(len, prompts)) + args.max_tokens + args.num_draft_tokens + 1
    model = reference.model  # the speculative run's cache is sized from the same layers (this rank's), with drafts
    if reference.stages is not None:  # pipeline stages: the budget covers every stage's layers
        from ..models.loader import model_on_meta
        model = model_on_meta(model_dir, reference.dtype)
    sizing = sizing_of(model.state_modules(args.num_draft_tokens), model.page_roles(16))
    # a slot for every sequence but pages for about a third of the batch at full length: growth forces
    # suspensions; a host tier of a few requests forces re-prefills too
    per_request = sizing.request_bytes(longest, 16)
    page_bytes = per_request - sizing.bytes_per_slot
    device_bytes = args.max_num_seqs * sizing.bytes_per_slot + int(page_bytes * max(2, args.max_num_seqs / 3))
    host_bytes = int(per_request * args.host_requests)
    llm = LLM(model_dir, device=args.device, max_num_seqs=args.max_num_seqs, speculative=spec,
              device_cache_bytes=device_bytes, host_cache_bytes=host_bytes, max_num_batched_tokens=256,
              num_slots=args.max_num_seqs, tensor_parallel_size=args.tensor_parallel_size,
              pipeline_parallel_size=args.pipeline_parallel_size)
    bar = tqdm(total=len(prompts), desc="requests", unit="req", disable=args.quiet)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, progress=lambda done, total: bar.update(done - bar.n))
    elapsed = time.perf_counter() - t0
    bar.close()
    tokens = sum(len(o.token_ids) for o in outs)

    t0 = time.perf_counter()
    ref = reference.generate(prompts, params)
    ref_elapsed = time.perf_counter() - t0
    same = sum(o.token_ids == r.token_ids for o, r in zip(outs, ref))
    s = llm.stats
    rate = s.num_accepted_tokens / max(s.num_draft_tokens, 1)
    print(f"model               {model_dir}")
    print(f"device budget       {device_bytes / 1e6:.2f} MB ({llm.manager.num_slots} slots, {llm.manager.num_pages} pages); "
          f"host {host_bytes / 1e6:.2f} MB")
    print(f"requests            {len(outs)}")
    print(f"tokens              {tokens}")
    print(f"tokens/s            {tokens / elapsed:.1f}  ({elapsed:.2f} s, {s.num_steps} steps); unconstrained "
          f"without speculation {tokens / ref_elapsed:.1f} ({elapsed / ref_elapsed:.2f}x its time)")
    print(f"suspensions         {s.num_suspensions}")
    print(f"resumes             {s.num_resumes}")
    print(f"re-prefills         {s.num_reprefills}")
    print(f"moved               {s.bytes_to_host / 1e6:.2f} MB to host, {s.bytes_to_device / 1e6:.2f} MB to device")
    print(f"draft acceptance    {s.num_accepted_tokens}/{s.num_draft_tokens} = {rate:.1%}")
    print(f"equal to the unconstrained run without speculation: {same}/{len(outs)} "
          f"{'yes' if same == len(outs) else 'NO'}")
    llm.manager.check_integrity()
    return 0 if same == len(outs) else 1
