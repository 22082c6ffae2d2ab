"""Kimi Linear hybrid (HF `model_type` "kimi_linear"): pre-norm decoder layers of Kimi Delta Attention or
MLA, each followed by a gated MLP or a MoE, over the cache manager's `kda` slot roles and `mla` pages."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..states import KDAState, MLAPages
from .batch import ForwardBatch
from .kimi_linear_config import DENSE, KDA, MLA, KimiLinearSpec
from .layers.embedding import Embedding
from .layers.kda_mixer import STATE_NAME, KDAMixer
from .layers.gated_mlp import GatedMLP
from .layers.kimi_moe import KimiMoE
from .layers.mla_attention import MLAAttention
from .layers.mlp import Linear
from .layers.norm import RMSNorm
from .layers.params import checkpoint_targets
from .registry import register

Device = torch.device | str


class DecoderLayer(nn.Module):
    """`x + self_attn(input_layernorm(x))`, then `x + mlp(post_attention_layernorm(x))`."""

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, hidden: int, eps: float, device: Device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn, self.mlp = self_attn, mlp
        self.input_layernorm = RMSNorm(hidden, eps, device, dtype)
        self.post_attention_layernorm = RMSNorm(hidden, eps, device, dtype)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), batch)
        return x + self.mlp(self.post_attention_layernorm(x))


def _mixer(s: KimiLinearSpec, kind: str, index: int, device: Device, dtype: torch.dtype) -> nn.Module:
    if kind == KDA:
        return KDAMixer(index, s.hidden_size, s.linear_num_heads, s.linear_head_dim, s.linear_conv_kernel_dim,
                        s.rms_norm_eps, device, dtype)
    return MLAAttention(index, s.hidden_size, s.num_attention_heads, s.q_lora_rank, s.kv_lora_rank,
                        s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.attention_bias, device, dtype)


def _mlp(s: KimiLinearSpec, kind: str, device: Device, dtype: torch.dtype) -> nn.Module:
    if kind == DENSE:
        return GatedMLP(s.hidden_size, s.intermediate_size, s.hidden_act, device, dtype)
    return KimiMoE(s.hidden_size, s.num_local_experts, s.num_experts_per_tok, s.moe_intermediate_size,
                   s.n_shared_experts, s.hidden_act, s.n_group, s.topk_group, s.norm_topk_prob,
                   s.routed_scaling_factor, device, dtype)


class Backbone(nn.Module):
    def __init__(self, s: KimiLinearSpec, device: Device, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(s.vocab_size, s.hidden_size, device, dtype)
        seen = {KDA: 0, MLA: 0}
        layers = []
        for kind, mlp_kind in zip(s.kinds, s.mlp_kinds):
            layers.append(DecoderLayer(_mixer(s, kind, seen[kind], device, dtype), _mlp(s, mlp_kind, device, dtype),
                                       s.hidden_size, s.rms_norm_eps, device, dtype))
            seen[kind] += 1
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps, device, dtype)


@register("kimi_linear")
class KimiLinear(nn.Module):
    """Checkpoint names as the original checkpoint and transformers' `save_pretrained` write them:
    `model.embed_tokens.weight`, `model.layers.{i}.{input,post_attention}_layernorm.weight`,
    `model.layers.{i}.self_attn.*` (KDA or MLA), `model.layers.{i}.block_sparse_moe.*` (MoE, and the dense
    MLP as transformers saves it; `mlp.*` is accepted for both), `model.norm.weight`, `lm_head.weight`
    (transformers never ties it)."""

    def __init__(self, spec: KimiLinearSpec, device: Device = "cpu", dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.spec, self.dtype = spec, dtype
        self.model = Backbone(spec, device, dtype)
        self.lm_head = Linear(spec.hidden_size, spec.vocab_size, False, device, dtype)

    @classmethod
    def from_config(cls, config: dict[str, Any], device: Device, dtype: torch.dtype) -> "KimiLinear":
        return cls(KimiLinearSpec.from_dict(config), device, dtype)

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    # ------------------------------------------------------------------ checkpoint
    def tensor_targets(self) -> dict[str, torch.Tensor]:
        return {_checkpoint_name(k): v for k, v in checkpoint_targets(self).items()}

    @staticmethod
    def checkpoint_names(name: str) -> list[str]:
        """Spellings of one tensor's name a checkpoint may use."""
        if ".block_sparse_moe." in name:
            return [name, name.replace(".block_sparse_moe.", ".mlp.")]
        return [name]

    # ------------------------------------------------------------------ cache contract
    def state_modules(self, num_draft_tokens: int) -> list[KDAState]:
        """One KDAState over the KDA layers (layer i = the i-th KDA layer), none without them."""
        s = self.spec
        if not s.count(KDA):
            return []
        return [KDAState(s.count(KDA), s.linear_num_heads, s.linear_head_dim, s.linear_conv_kernel_dim,
                         sections=(s.linear_width,) * 3, dtype=self.dtype, num_draft_tokens=num_draft_tokens)]

    def page_roles(self, page_size: int) -> MLAPages | None:
        """Latent pages over the MLA layers (layer i = the i-th MLA layer), None without them."""
        s = self.spec
        if not s.count(MLA):
            return None
        return MLAPages(s.count(MLA), s.kv_lora_rank, s.qk_rope_head_dim, page_size, self.dtype)

    # ------------------------------------------------------------------ compute
    def _check(self, num_tokens: int, batch: ForwardBatch) -> None:
        gen = batch.num_generation_rows * batch.generation_tokens
        if batch.num_context_tokens + gen != num_tokens:
            raise ValueError(f"{num_tokens} tokens, but the batch has {batch.num_context_tokens} context tokens "
                             f"and {batch.num_generation_rows} x {batch.generation_tokens} generation tokens")
        if not (batch.num_generation_rows and self.spec.count(KDA)):
            return
        replay = "pend_n" in batch.states[STATE_NAME]
        if batch.speculative and not replay:
            raise ValueError("a speculative step needs the pending-draft roles: build the state with "
                             "num_draft_tokens > 0")
        if not batch.speculative and replay:
            raise ValueError("with pending-draft roles every generation step must run speculative=True (T = 1 is "
                             "fine): plain decode would skip the accepted drafts still pending")
        if not batch.speculative and batch.generation_tokens != 1:
            raise ValueError(f"plain decode feeds 1 token per row, got {batch.generation_tokens}")

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """input_ids: [N] -> hidden [N, D] after the final norm."""
        self._check(input_ids.shape[0], batch)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, batch)
        return self.model.norm(x)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [M, D] -> [M, V] float32."""
        return F.linear(hidden, self.lm_head.weight).float()


def _checkpoint_name(name: str) -> str:
    """Our module path -> the checkpoint's name: the feed-forward lives under `block_sparse_moe.`."""
    return name.replace(".mlp.", ".block_sparse_moe.")
