"""Qwen3-Next hybrid (HF `model_type` "qwen3_next"): pre-norm decoder layers whose token mixer is Gated
DeltaNet or gated GQA attention with partial RoPE (per `layer_types`), each followed by a gated MLP or a
MoE with a shared expert, over the cache manager's roles."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..states import GDNState, KVPages
from .batch import ForwardBatch
from .layers.embedding import Embedding
from .layers.gated_attention import GatedPagedAttention
from .layers.gated_mlp import GatedMLP
from .layers.gdn_mixer import STATE_NAME, GatedDeltaNetMixer
from .layers.mlp import Linear
from .layers.params import checkpoint_targets
from .layers.qwen_norm import OffsetRMSNorm
from .layers.rope import PartialRoPE
from .layers.shared_moe import SharedExpertMoE
from .qwen3_next_config import Qwen3NextSpec
from .registry import register

Device = torch.device | str
GDN, ATTN = "linear_attention", "full_attention"


class DecoderLayer(nn.Module):
    """`h = x + mixer(input_layernorm(x)); h + mlp(post_attention_layernorm(h))`; the mixer is `linear_attn`
    (GDN) or `self_attn` (attention), as checkpoints name them."""

    def __init__(self, s: Qwen3NextSpec, layer: int, kind_index: int, rope: PartialRoPE,
                 device: Device, dtype: torch.dtype) -> None:
        super().__init__()
        self.kind = s.layer_types[layer]
        if self.kind == GDN:
            self.linear_attn = GatedDeltaNetMixer(
                kind_index, s.hidden_size, s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim,
                s.linear_value_head_dim, s.linear_conv_kernel_dim, s.rms_norm_eps, device, dtype)
        else:
            self.self_attn = GatedPagedAttention(
                kind_index, s.hidden_size, s.num_attention_heads, s.num_key_value_heads, s.head_dim,
                s.attention_bias, rope, s.rms_norm_eps, device, dtype)
        if s.is_moe(layer):
            self.mlp: nn.Module = SharedExpertMoE(
                s.hidden_size, s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size,
                s.shared_expert_intermediate_size, s.hidden_act, s.norm_topk_prob, device, dtype)
        else:
            self.mlp = GatedMLP(s.hidden_size, s.intermediate_size, s.hidden_act, device, dtype)
        self.input_layernorm = OffsetRMSNorm(s.hidden_size, s.rms_norm_eps, device, dtype)
        self.post_attention_layernorm = OffsetRMSNorm(s.hidden_size, s.rms_norm_eps, device, dtype)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x: [N, D] -> [N, D]."""
        h = self.input_layernorm(x)
        h = self.linear_attn(h, batch) if self.kind == GDN else self.self_attn(h, batch, cos_sin)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """`embed_tokens`, `layers`, `norm`, and the (non-checkpoint) rotary table shared by attention layers."""

    def __init__(self, s: Qwen3NextSpec, device: Device, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(s.vocab_size, s.hidden_size, device, dtype)
        self.rotary = PartialRoPE(s.head_dim, s.rotary_dim, s.rope_theta, device)
        seen = {GDN: 0, ATTN: 0}
        layers = []
        for i, kind in enumerate(s.layer_types):
            layers.append(DecoderLayer(s, i, seen[kind], self.rotary, device, dtype))
            seen[kind] += 1
        self.layers = nn.ModuleList(layers)
        self.norm = OffsetRMSNorm(s.hidden_size, s.rms_norm_eps, device, dtype)


@register("qwen3_next")
class Qwen3Next(nn.Module):
    """Checkpoint names as transformers' Qwen3NextForCausalLM: `model.embed_tokens.weight`,
    `model.layers.{i}.{input_layernorm,post_attention_layernorm}.weight`, `model.layers.{i}.linear_attn.*` /
    `.self_attn.*`, `model.layers.{i}.mlp.*` (experts one tensor each), `model.norm.weight`, `lm_head.weight`
    (absent when tied). Multi-token-prediction tensors (`mtp.*`) are not read."""

    def __init__(self, spec: Qwen3NextSpec, device: Device = "cpu", dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.spec, self.dtype = spec, dtype
        self.model = Backbone(spec, device, dtype)
        self.lm_head = None if spec.tie_word_embeddings else Linear(spec.hidden_size, spec.vocab_size, False, device, dtype)

    @classmethod
    def from_config(cls, config: dict[str, Any], device: Device, dtype: torch.dtype) -> "Qwen3Next":
        return cls(Qwen3NextSpec.from_dict(config), device, dtype)

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    # ------------------------------------------------------------------ checkpoint
    def tensor_targets(self) -> dict[str, torch.Tensor]:
        return checkpoint_targets(self)

    @staticmethod
    def checkpoint_names(name: str) -> list[str]:
        return [name]

    # ------------------------------------------------------------------ cache contract
    def state_modules(self, num_draft_tokens: int, hist: int | None = None) -> list[GDNState]:
        """One GDNState over the GDN layers (layer i = the i-th "linear_attention"), none without them."""
        s = self.spec
        if not s.count(GDN):
            return []
        return [GDNState(s.count(GDN), s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim,
                         s.linear_value_head_dim, s.linear_conv_kernel_dim, dtype=self.dtype,
                         num_draft_tokens=num_draft_tokens, hist=hist)]

    def page_roles(self, page_size: int) -> KVPages | None:
        """K/V pages over the attention layers (layer i = the i-th "full_attention"), None without them."""
        s = self.spec
        if not s.count(ATTN):
            return None
        return KVPages(s.count(ATTN), s.num_key_value_heads, s.head_dim, page_size, self.dtype)

    # ------------------------------------------------------------------ compute
    def _check(self, num_tokens: int, batch: ForwardBatch) -> None:
        gen = batch.num_generation_rows * batch.generation_tokens
        if batch.num_context_tokens + gen != num_tokens:
            raise ValueError(f"{num_tokens} tokens, but the batch has {batch.num_context_tokens} context tokens "
                             f"and {batch.num_generation_rows} x {batch.generation_tokens} generation tokens")
        if not (batch.num_generation_rows and self.spec.count(GDN)):
            return
        replay = "pnat" in batch.states[STATE_NAME]
        if batch.speculative and not replay:
            raise ValueError("a speculative step needs the replay roles: build the state with num_draft_tokens > 0")
        if not batch.speculative and replay:
            raise ValueError("with replay roles every generation step must run speculative=True (T = 1 is fine): "
                             "the accept hook counts the step's tokens into the replay history")
        if not batch.speculative and batch.generation_tokens != 1:
            raise ValueError(f"plain decode feeds 1 token per row, got {batch.generation_tokens}")

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """input_ids: [N] -> hidden [N, D] after the final norm."""
        self._check(input_ids.shape[0], batch)
        x = self.model.embed_tokens(input_ids)
        cos_sin = self.model.rotary.cos_sin(batch.positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, batch, cos_sin)
        return self.model.norm(x)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [M, D] -> [M, V] float32."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()
