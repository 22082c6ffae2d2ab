"""Qwen3-Next hybrid (HF `model_type` "qwen3_next"): pre-norm decoder layers whose token mixer is Gated
DeltaNet or gated GQA attention with partial RoPE (per `layer_types`), each followed by a gated MLP or a
MoE with a shared expert, over the cache manager's roles."""
from __future__ import annotations

import torch

from ..parallel import SINGLE, TPGroup, head_share
from ..parallel.pipeline import Stage, whole
from ..states import GDNState, KVPages
from .hybrid_lm import Device, HybridLM, Trunk
from .layers.attention import kv_share
from .layers.decoder_layer import DecoderLayer
from .layers.embedding import Embedding
from .layers.gated_attention import GatedPagedAttention
from .layers.gated_mlp import GatedMLP
from .layers.gdn_mixer import STATE_NAME, GatedDeltaNetMixer
from .layers.mlp import Linear
from .layers.norm import RMSNorm
from .layers.rope import PartialRoPE
from .layers.shared_moe import SharedExpertMoE
from .qwen3_next_config import Qwen3NextSpec
from .registry import register

GDN, ATTN = "linear_attention", "full_attention"


def _layer(s: Qwen3NextSpec, layer: int, kind_index: int, rope: PartialRoPE, device: Device,
           dtype: torch.dtype, tp: TPGroup) -> DecoderLayer:
    """Layer `layer`, the `kind_index`-th of its kind; the mixer is `linear_attn` (GDN) or `self_attn`
    (attention), as checkpoints name them."""
    kind = s.layer_types[layer]
    if kind == GDN:
        name, mixer = "linear_attn", GatedDeltaNetMixer(
            kind_index, s.hidden_size, s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim,
            s.linear_value_head_dim, s.linear_conv_kernel_dim, s.rms_norm_eps, device, dtype, tp)
    else:
        name, mixer = "self_attn", GatedPagedAttention(
            kind_index, s.hidden_size, s.num_attention_heads, s.num_key_value_heads, s.head_dim,
            s.attention_bias, rope, s.rms_norm_eps, device, dtype, tp)
    if s.is_moe(layer):
        mlp: torch.nn.Module = SharedExpertMoE(
            s.hidden_size, s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size,
            s.shared_expert_intermediate_size, s.hidden_act, s.norm_topk_prob, device, dtype, tp)
    else:
        mlp = GatedMLP(s.hidden_size, s.intermediate_size, s.hidden_act, device, dtype, tp)
    return DecoderLayer(kind, name, mixer, mlp, _norm(s, device, dtype), _norm(s, device, dtype), tp)


def _norm(s: Qwen3NextSpec, device: Device, dtype: torch.dtype) -> RMSNorm:
    return RMSNorm(s.hidden_size, s.rms_norm_eps, device, dtype, zero_centred=True)


@register("qwen3_next")
class Qwen3Next(HybridLM):
    """Checkpoint names as transformers' Qwen3NextForCausalLM: `model.embed_tokens.weight`,
    `model.layers.{i}.{input_layernorm,post_attention_layernorm}.weight`, `model.layers.{i}.linear_attn.*` /
    `.self_attn.*`, `model.layers.{i}.mlp.*` (experts one tensor each), `model.norm.weight`, `lm_head.weight`
    (absent when tied). Multi-token-prediction tensors (`mtp.*`) are not read. The attention layers share one
    (non-checkpoint) rotary table."""

    spec_type = Qwen3NextSpec
    recurrent_kind, attention_kind, state_name = GDN, ATTN, STATE_NAME

    def __init__(self, spec: Qwen3NextSpec, device: Device = "cpu", dtype: torch.dtype = torch.float32,
                 tp: TPGroup = SINGLE, stage: Stage | None = None) -> None:
        stage = stage or whole(len(spec.layer_types))
        rope = PartialRoPE(spec.head_dim, spec.rotary_dim, spec.rope_theta, device)
        seen = {GDN: 0, ATTN: 0}
        layers = {}
        for i, kind in enumerate(spec.layer_types):
            if i in stage:  # a mixer's index counts the stage's layers of its kind before it
                layers[i] = _layer(spec, i, seen[kind], rope, device, dtype, tp)
                seen[kind] += 1
        tied, last = spec.tie_word_embeddings, stage.is_last
        # a tied LM head reads the embedding: the last stage keeps it too
        embedding = Embedding(spec.vocab_size, spec.hidden_size, device, dtype) if stage.is_first or (tied and last) else None
        trunk = Trunk("embed_tokens", embedding, layers, "norm", _norm(spec, device, dtype) if last else None)
        head = Linear(spec.hidden_size, spec.vocab_size, False, device, dtype) if last and not tied else None
        super().__init__(spec, "model", trunk, head, dtype, tp, stage)

    @staticmethod
    def layer_kinds_of(spec: Qwen3NextSpec) -> list[str]:
        return list(spec.layer_types)

    def recurrent_state(self, num_layers: int, num_draft_tokens: int, hist: int | None = None) -> GDNState:
        """This rank's key heads and their value heads (all of them for one rank)."""
        s = self.spec
        n = self.tp.size
        head_share(self.tp, s.linear_num_key_heads, "linear_num_key_heads")
        return GDNState(num_layers, s.linear_num_key_heads // n, s.linear_num_value_heads // n, s.linear_key_head_dim,
                        s.linear_value_head_dim, s.linear_conv_kernel_dim, dtype=self.dtype,
                        num_draft_tokens=num_draft_tokens, hist=hist)

    def attention_pages(self, num_layers: int, page_size: int) -> KVPages:
        s = self.spec
        kv_heads = kv_share(self.tp, s.num_attention_heads, s.num_key_value_heads)[1]
        return KVPages(num_layers, kv_heads, s.head_dim, page_size, self.dtype)
