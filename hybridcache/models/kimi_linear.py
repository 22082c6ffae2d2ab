"""Kimi Linear hybrid (HF `model_type` "kimi_linear"): pre-norm decoder layers of Kimi Delta Attention or
MLA, each followed by a gated MLP or a MoE, over the cache manager's `kda` slot roles and `mla` pages."""
from __future__ import annotations

import torch
from torch import nn

from ..parallel import SINGLE, TPGroup, head_share
from ..parallel.pipeline import Stage, whole
from ..states import KDAState, MLAPages
from .hybrid_lm import Device, DraftRoles, HybridLM, Trunk
from .kimi_linear_config import DENSE, KDA, MLA, KimiLinearSpec
from .layers.decoder_layer import DecoderLayer
from .layers.embedding import Embedding
from .layers.gated_mlp import GatedMLP
from .layers.kda_mixer import STATE_NAME, KDAMixer
from .layers.kimi_moe import KimiMoE
from .layers.mla_attention import MLAAttention
from .layers.mlp import Linear
from .layers.norm import RMSNorm
from .registry import register

PENDING = DraftRoles("pend_n", "pending-draft", "plain decode would skip the accepted drafts still pending")


def _mixer(s: KimiLinearSpec, kind: str, index: int, device: Device, dtype: torch.dtype, tp: TPGroup) -> nn.Module:
    if kind == KDA:
        return KDAMixer(index, s.hidden_size, s.linear_num_heads, s.linear_head_dim, s.linear_conv_kernel_dim,
                        s.rms_norm_eps, device, dtype, tp)
    return MLAAttention(index, s.hidden_size, s.num_attention_heads, s.q_lora_rank, s.kv_lora_rank,
                        s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.attention_bias, device, dtype, tp)


def _mlp(s: KimiLinearSpec, kind: str, device: Device, dtype: torch.dtype, tp: TPGroup) -> nn.Module:
    if kind == DENSE:
        return GatedMLP(s.hidden_size, s.intermediate_size, s.hidden_act, device, dtype, tp)
    return KimiMoE(s.hidden_size, s.num_local_experts, s.num_experts_per_tok, s.moe_intermediate_size,
                   s.n_shared_experts, s.hidden_act, s.n_group, s.topk_group, s.norm_topk_prob,
                   s.routed_scaling_factor, device, dtype, tp)


def _layers(s: KimiLinearSpec, device: Device, dtype: torch.dtype, tp: TPGroup, stage: Stage) -> dict[int, DecoderLayer]:
    """The stage's layers by number; the mixer is `self_attn` (KDA or MLA), the `i`-th of its kind on the stage."""
    seen = {KDA: 0, MLA: 0}
    layers = {}
    for i, (kind, mlp_kind) in enumerate(zip(s.kinds, s.mlp_kinds)):
        if i not in stage:
            continue
        layers[i] = DecoderLayer(kind, "self_attn", _mixer(s, kind, seen[kind], device, dtype, tp),
                                 _mlp(s, mlp_kind, device, dtype, tp), RMSNorm(s.hidden_size, s.rms_norm_eps, device, dtype),
                                 RMSNorm(s.hidden_size, s.rms_norm_eps, device, dtype), tp)
        seen[kind] += 1
    return layers


@register("kimi_linear")
class KimiLinear(HybridLM):
    """Checkpoint names as the original checkpoint and transformers' `save_pretrained` write them:
    `model.embed_tokens.weight`, `model.layers.{i}.{input,post_attention}_layernorm.weight`,
    `model.layers.{i}.self_attn.*` (KDA or MLA), `model.layers.{i}.block_sparse_moe.*` (MoE, and the dense
    MLP as transformers saves it; `mlp.*` is accepted for both), `model.norm.weight`, `lm_head.weight`
    (transformers never ties it)."""

    spec_type = KimiLinearSpec
    recurrent_kind, attention_kind, state_name, draft_roles = KDA, MLA, STATE_NAME, PENDING

    def __init__(self, spec: KimiLinearSpec, device: Device = "cpu", dtype: torch.dtype = torch.float32,
                 tp: TPGroup = SINGLE, stage: Stage | None = None) -> None:
        stage = stage or whole(len(spec.kinds))
        first, last = stage.is_first, stage.is_last
        trunk = Trunk("embed_tokens", Embedding(spec.vocab_size, spec.hidden_size, device, dtype) if first else None,
                      _layers(spec, device, dtype, tp, stage), "norm",
                      RMSNorm(spec.hidden_size, spec.rms_norm_eps, device, dtype) if last else None)
        head = Linear(spec.hidden_size, spec.vocab_size, False, device, dtype) if last else None
        super().__init__(spec, "model", trunk, head, dtype, tp, stage)

    @staticmethod
    def layer_kinds_of(spec: KimiLinearSpec) -> list[str]:
        return list(spec.kinds)

    def tensor_targets(self) -> dict[str, torch.Tensor]:
        """Our module path -> the checkpoint's name: the feed-forward lives under `block_sparse_moe.`."""
        return {k.replace(".mlp.", ".block_sparse_moe."): v for k, v in super().tensor_targets().items()}

    @staticmethod
    def checkpoint_names(name: str) -> list[str]:
        """Spellings of one tensor's name a checkpoint may use."""
        if ".block_sparse_moe." in name:
            return [name, name.replace(".block_sparse_moe.", ".mlp.")]
        return [name]

    def recurrent_state(self, num_layers: int, num_draft_tokens: int) -> KDAState:
        """This rank's heads (all of them for one rank); the MLA latent pages are replicated."""
        s = self.spec
        heads = head_share(self.tp, s.linear_num_heads, "linear_attn_config num_heads")[1]
        width = s.linear_width // s.linear_num_heads * heads
        return KDAState(num_layers, heads, s.linear_head_dim, s.linear_conv_kernel_dim,
                        sections=(width,) * 3, dtype=self.dtype, num_draft_tokens=num_draft_tokens)

    def attention_pages(self, num_layers: int, page_size: int) -> MLAPages:
        s = self.spec
        return MLAPages(num_layers, s.kv_lora_rank, s.qk_rope_head_dim, page_size, self.dtype)
