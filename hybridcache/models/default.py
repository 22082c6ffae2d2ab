"""The embedded default: a tiny Nemotron-H-style checkpoint built deterministically from a config."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .default_tokenizer import CHAT_TEMPLATE, CORPUS, save_default_tokenizer

SEED = 0
LM_HEAD_SCALE = 8.0  # random tiny models have flat logits; a wider head keeps greedy choices off near-ties

DEFAULT_CONFIG: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    hybrid_override_pattern="M-M*-ME",
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    mamba_num_heads=8,
    mamba_head_dim=16,
    n_groups=2,
    ssm_state_size=16,
    conv_kernel=4,
    chunk_size=32,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    moe_shared_expert_intermediate_size=64,
    max_position_embeddings=2048,
    eos_token_id=2,
    tie_word_embeddings=False,
)


def default_config() -> Any:
    """The default's transformers `NemotronHConfig` (fp32)."""
    from transformers import NemotronHConfig

    return NemotronHConfig(**DEFAULT_CONFIG)


def build_default_checkpoint(path: str | Path) -> Path:
    """Write the default checkpoint (config.json + model.safetensors + the tokenizer's two files) to
    `path`; same bytes every time.

    Weights: transformers' own random init under `torch.manual_seed(SEED)` (the global RNG state is
    restored afterwards), with the LM head scaled by LM_HEAD_SCALE.
    """
    from transformers import NemotronHForCausalLM

    path = Path(path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = NemotronHForCausalLM(default_config()).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    save_default_tokenizer(path, DEFAULT_CONFIG["vocab_size"], DEFAULT_CONFIG["max_position_embeddings"])
    return path


def recipe() -> str:
    """What the built checkpoint depends on; a cached copy whose stamp differs is rebuilt."""
    import tokenizers
    import transformers

    return json.dumps([DEFAULT_CONFIG, SEED, LM_HEAD_SCALE, transformers.__version__,
                       "tokenizer", CORPUS, CHAT_TEMPLATE, tokenizers.__version__], sort_keys=True)
