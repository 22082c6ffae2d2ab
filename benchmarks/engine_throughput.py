"""Engine throughput against transformers' `generate` on the same checkpoint and prompts, as a ratio.

Builds a random Nemotron-H-like checkpoint (saved once under --dir), then times, in one run:
  transformers: model.generate on a padded batch (greedy, its torch paths)
  hybridcache:  LLM.generate on the same prompts (greedy), with and without n-gram speculation

    python benchmarks/engine_throughput.py --size tiny            # CPU
    python benchmarks/engine_throughput.py --size 1b --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SIZES = {
    # hidden, pattern, mamba heads, head dim, state, attn heads, kv heads, head_dim, ffn, vocab
    "tiny": dict(hidden_size=128, hybrid_override_pattern="M-M*-M-", mamba_num_heads=8, mamba_head_dim=16,
                 ssm_state_size=32, n_groups=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 intermediate_size=256, vocab_size=1024),
    # ~0.86B: 12 Mamba2 layers of 64 heads x 64 x 128 state, 3 GQA layers, 12 MLPs
    "1b": dict(hidden_size=2048, hybrid_override_pattern="M-M-M*-M-M-M*-M-M-M*-M-M-M-",
               mamba_num_heads=64, mamba_head_dim=64, ssm_state_size=128, n_groups=8, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=5120, vocab_size=32000),
}


def build(path: Path, size: str) -> None:
    from transformers import NemotronHConfig, NemotronHForCausalLM

    if (path / "config.json").exists():
        return
    kw = dict(SIZES[size])
    cfg = NemotronHConfig(num_hidden_layers=len(kw["hybrid_override_pattern"]), conv_kernel=4, chunk_size=64,
                          max_position_embeddings=16384, tie_word_embeddings=False, use_mamba_kernels=False, **kw)
    torch.manual_seed(0)
    model = NemotronHForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from hybridcache import LLM, SamplingParams, SpeculativeConfig
    from hybridcache.workload import make_prompts

    path = Path(args.dir or f"/tmp/hybridcache-bench-{args.size}")
    build(path, args.size)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device).eval()
    vocab = hf.config.vocab_size
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    engines = {
        "hybridcache": LLM(path, device=args.device, dtype=args.dtype, max_num_seqs=max(args.batch),
                           max_num_batched_tokens=4096),
        "hybridcache+ngram(k=3)": LLM(path, device=args.device, dtype=args.dtype, max_num_seqs=max(args.batch),
                                      max_num_batched_tokens=4096, speculative=SpeculativeConfig(num_draft_tokens=3)),
    }
    print(f"{args.size} on {args.device} {args.dtype}; prompt {args.prompt_len}, {args.max_tokens} new tokens")
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
            print(f"{b:>5} {name:>24} {rate:>9.1f} {rate / hf_rate:>15.2f}x")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
