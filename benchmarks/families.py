"""Random checkpoints of each model family at three sizes, built once from a config (no download).

`tiny` and `small` cost about the same to run on a CPU; `small` keeps the 1b's proportion of recurrent state
to attention K/V (one slot holds as many bytes as about 1000 tokens of K/V, where `tiny`'s holds about 100),
which is what decides how a device budget is best split between slots and pages.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

FAMILIES: dict[str, dict[str, dict]] = {
    "nemotron_h": {
        "tiny": dict(hidden_size=128, hybrid_override_pattern="M-M*-M-", mamba_num_heads=8, mamba_head_dim=16,
                     ssm_state_size=32, n_groups=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                     intermediate_size=256, vocab_size=1024, conv_kernel=4, chunk_size=64),
        # slot 287 KB (4 Mamba2 layers of 16 heads x 16 x 64 state), K/V 256 B a token (1 layer, 1 head of 32)
        "small": dict(hidden_size=128, hybrid_override_pattern="M-M-M*-M-", mamba_num_heads=16, mamba_head_dim=16,
                      ssm_state_size=64, n_groups=2, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                      intermediate_size=256, vocab_size=1024, conv_kernel=4, chunk_size=64),
        # ~0.86B: 12 Mamba2 layers of 64 heads x 64 x 128 state, 3 GQA layers, 12 MLPs
        "1b": dict(hidden_size=2048, hybrid_override_pattern="M-M-M*-M-M-M*-M-M-M*-M-M-M-",
                   mamba_num_heads=64, mamba_head_dim=64, ssm_state_size=128, n_groups=8, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, intermediate_size=5120, vocab_size=32000, conv_kernel=4,
                   chunk_size=128),
    },
    "qwen3_next": {
        "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                     linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                     linear_value_head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                     shared_expert_intermediate_size=128, intermediate_size=256, vocab_size=1024),
        # slot 224 KB (3 GDN layers of 8 value heads, 32 x 64 state), K/V 256 B a token (1 layer, 1 head of 32)
        "small": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                      linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32,
                      linear_value_head_dim=64, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                      shared_expert_intermediate_size=128, intermediate_size=256, vocab_size=1024),
        # ~1B: 12 layers (9 GDN with 16 key / 32 value heads of 128, 3 gated attention), MoE 8 x 512 + shared
        "1b": dict(hidden_size=2048, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=2,
                   head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                   linear_value_head_dim=128, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=512,
                   shared_expert_intermediate_size=2048, intermediate_size=5120, vocab_size=32000),
    },
    "kimi_linear": {
        "tiny": dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=None,
                     qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, num_local_experts=4,
                     num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, vocab_size=1024,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     linear_attn_config={"kda_layers": [1, 3], "full_attn_layers": [2, 4], "head_dim": 32,
                                         "num_heads": 4, "short_conv_kernel_size": 4}),
        # slot 449 KB (3 KDA layers of 8 heads x 64 x 64), K/V 320 B a token (1 MLA layer: 64 latent + 16 rope)
        "small": dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=None,
                      qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, num_local_experts=4,
                      num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, vocab_size=1024,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      linear_attn_config={"kda_layers": [1, 2, 3], "full_attn_layers": [4], "head_dim": 64,
                                          "num_heads": 8, "short_conv_kernel_size": 4}),
        # ~1B: 12 layers (9 KDA of 16 heads x 128, 3 MLA), MoE 8 x 512 + 1 shared
        "1b": dict(hidden_size=2048, intermediate_size=5120, moe_intermediate_size=512, num_hidden_layers=12,
                   num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
                   qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, num_local_experts=8,
                   num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
                   vocab_size=32000, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                   linear_attn_config={"kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11],
                                       "full_attn_layers": [4, 8, 12], "head_dim": 128, "num_heads": 16,
                                       "short_conv_kernel_size": 4}),
    },
}


def build(path: Path, family: str, size: str) -> Path:
    """Save a seeded random checkpoint of `family` at `size` to `path` (skipped when already there)."""
    import transformers

    if (path / "config.json").exists():
        return path
    kw = dict(FAMILIES[family][size])
    if family == "nemotron_h":
        config = transformers.NemotronHConfig(num_hidden_layers=len(kw["hybrid_override_pattern"]),
                                              max_position_embeddings=16384, tie_word_embeddings=False, **kw)
        cls = transformers.NemotronHForCausalLM
    elif family == "qwen3_next":
        config = transformers.Qwen3NextConfig(max_position_embeddings=16384, tie_word_embeddings=False, **kw)
        cls = transformers.Qwen3NextForCausalLM
    else:
        config = transformers.KimiLinearConfig(tie_word_embeddings=False, **kw)
        cls = transformers.KimiLinearForCausalLM
    # initialised on the GPU where there is one: a 1B-class MoE took over 200 s to initialise on the GPU
    # machine's CPUs (the weights then differ from a CPU build's, alike for every engine of a run)
    on_gpu = torch.cuda.is_available()
    with torch.random.fork_rng(devices=[0] if on_gpu else []), torch.device("cuda" if on_gpu else "cpu"):
        torch.manual_seed(0)
        model = cls(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    if size == "1b":
        model.to(torch.bfloat16)  # halves the bytes written and read back for the large sizes
    model.save_pretrained(path)
    return path


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The arguments every engine benchmark takes: which checkpoint, where, on what."""
    ap.add_argument("--family", choices=sorted(FAMILIES), default="nemotron_h")
    ap.add_argument("--size", choices=["tiny", "small", "1b"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--dir", default=None, help="checkpoint directory (default: /tmp/hybridcache-bench-FAMILY-SIZE)")


def checkpoint(args: argparse.Namespace) -> Path:
    """The benchmark's checkpoint directory, built on first use."""
    path = Path(args.dir or f"/tmp/hybridcache-bench-{args.family}-{args.size}")
    return build(path, args.family, args.size)


def request_bytes(path: Path, dtype: str, num_tokens: int, num_draft_tokens: int = 0, page_size: int = 16) -> int:
    """Device bytes one request of `num_tokens` tokens holds (pages and slot, every role): what
    `LLM.device_bytes_needed` answers, known before the LLM is built (the model is built on the meta
    device, so no weights are read). Pass `num_tokens` = prompt + max_tokens + num_draft_tokens + 1 (the
    verify lookahead) and multiply by the batch: every request of the batch is then resident at once."""
    from hybridcache.cache import sizing_of
    from hybridcache.engine.llm import DTYPES
    from hybridcache.models.checkpoint import read_config
    from hybridcache.models.registry import model_class

    config = read_config(path)
    model = model_class(config.get("model_type")).from_config(config, torch.device("meta"), DTYPES[dtype])
    sizing = sizing_of(model.state_modules(num_draft_tokens), model.page_roles(page_size))
    return sizing.request_bytes(num_tokens, page_size)
