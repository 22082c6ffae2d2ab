"""NemotronH hybrid (HF `model_type` "nemotron_h"): pre-norm residual blocks of Mamba2, GQA attention
(no positional rotation), relu² MLP and MoE layers in any pattern, over the cache manager's roles."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..states import KVPages, Mamba2State
from .batch import ForwardBatch
from .layers.attention import PagedGQAAttention
from .layers.embedding import Embedding
from .layers.mamba2_mixer import STATE_NAME, Mamba2Mixer
from .layers.mlp import MLP, Linear
from .layers.moe import MoE
from .layers.norm import RMSNorm
from .layers.params import checkpoint_targets
from .nemotron_h_config import NemotronHSpec
from .registry import register

Device = torch.device | str


def _mamba(s: NemotronHSpec, index: int, device: Device, dtype: torch.dtype) -> nn.Module:
    # transformers' mixer clamps dt below at time_step_min (not config.time_step_limit); so do we
    return Mamba2Mixer(index, s.hidden_size, s.mamba_num_heads, s.mamba_head_dim, s.n_groups, s.ssm_state_size,
                       s.conv_kernel, s.chunk_size, (s.time_step_min, float("inf")), s.layer_norm_epsilon,
                       s.use_bias, s.use_conv_bias, device, dtype)


def _attention(s: NemotronHSpec, index: int, device: Device, dtype: torch.dtype) -> nn.Module:
    return PagedGQAAttention(index, s.hidden_size, s.num_attention_heads, s.num_key_value_heads,
                             s.attn_head_dim, False, device, dtype)


def _mlp(s: NemotronHSpec, index: int, device: Device, dtype: torch.dtype) -> nn.Module:
    return MLP(s.hidden_size, s.intermediate_size, s.mlp_hidden_act, s.mlp_bias, device, dtype)


def _moe(s: NemotronHSpec, index: int, device: Device, dtype: torch.dtype) -> nn.Module:
    return MoE(s.hidden_size, s.n_routed_experts, s.num_experts_per_tok, s.moe_intermediate_size,
               s.moe_shared_expert_intermediate_size, s.moe_latent_size, s.mlp_hidden_act, s.mlp_bias,
               s.n_group, s.topk_group, s.norm_topk_prob, s.routed_scaling_factor, device, dtype)


# kind -> (builder, whether the mixer reads the ForwardBatch)
MIXERS: dict[str, tuple[Callable[..., nn.Module], bool]] = {
    "M": (_mamba, True), "*": (_attention, True), "-": (_mlp, False), "E": (_moe, False),
}


class Block(nn.Module):
    """`x + mixer(norm(x))`."""

    def __init__(self, kind: str, mixer: nn.Module, norm: RMSNorm, reads_batch: bool) -> None:
        super().__init__()
        self.kind, self.reads_batch = kind, reads_batch
        self.norm, self.mixer = norm, mixer

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        h = self.norm(x)
        return x + (self.mixer(h, batch) if self.reads_batch else self.mixer(h))


class Backbone(nn.Module):
    def __init__(self, s: NemotronHSpec, device: Device, dtype: torch.dtype) -> None:
        super().__init__()
        self.embeddings = Embedding(s.vocab_size, s.hidden_size, device, dtype)
        seen = {kind: 0 for kind in MIXERS}
        blocks = []
        for kind in s.pattern:
            build, reads_batch = MIXERS[kind]
            mixer = build(s, seen[kind], device, dtype)
            seen[kind] += 1
            blocks.append(Block(kind, mixer, RMSNorm(s.hidden_size, s.layer_norm_epsilon, device, dtype), reads_batch))
        self.layers = nn.ModuleList(blocks)
        self.norm_f = RMSNorm(s.hidden_size, s.layer_norm_epsilon, device, dtype)


@register("nemotron_h")
class NemotronH(nn.Module):
    """Checkpoint names: `backbone.embeddings.weight`, `backbone.layers.{i}.norm.weight`,
    `backbone.layers.{i}.mixer.*`, `backbone.norm_f.weight`, `lm_head.weight`; a `model.` prefix is accepted
    for `backbone.`. The LM head is never tied to the embeddings (transformers' NemotronH does not tie either,
    whatever `tie_word_embeddings` says)."""

    def __init__(self, spec: NemotronHSpec, device: Device = "cpu", dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.spec, self.dtype = spec, dtype
        self.backbone = Backbone(spec, device, dtype)
        self.lm_head = Linear(spec.hidden_size, spec.vocab_size, False, device, dtype)

    @classmethod
    def from_config(cls, config: dict[str, Any], device: Device, dtype: torch.dtype) -> "NemotronH":
        return cls(NemotronHSpec.from_dict(config), device, dtype)

    # ------------------------------------------------------------------ checkpoint
    def tensor_targets(self) -> dict[str, torch.Tensor]:
        return checkpoint_targets(self)

    @staticmethod
    def checkpoint_names(name: str) -> list[str]:
        """Spellings of one tensor's name a checkpoint may use."""
        if name.startswith("backbone."):
            return [name, "model." + name[len("backbone."):]]
        return [name]

    # ------------------------------------------------------------------ cache contract
    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    def state_modules(self, num_draft_tokens: int, hist: int | None = None) -> list[Mamba2State]:
        """One Mamba2State over the model's Mamba2 layers (layer i = the i-th `M`), none without them."""
        s = self.spec
        if not s.count("M"):
            return []
        return [Mamba2State(s.count("M"), s.mamba_num_heads, s.mamba_head_dim, s.n_groups, s.ssm_state_size,
                            s.conv_kernel, dtype=self.dtype, num_draft_tokens=num_draft_tokens, hist=hist)]

    def page_roles(self, page_size: int) -> KVPages | None:
        """K/V pages over the attention layers (layer i = the i-th `*`), None without them."""
        s = self.spec
        if not s.count("*"):
            return None
        return KVPages(s.count("*"), s.num_key_value_heads, s.attn_head_dim, page_size, self.dtype)

    # ------------------------------------------------------------------ compute
    def _check(self, num_tokens: int, batch: ForwardBatch) -> None:
        gen = batch.num_generation_rows * batch.generation_tokens
        if batch.num_context_tokens + gen != num_tokens:
            raise ValueError(f"{num_tokens} tokens, but the batch has {batch.num_context_tokens} context tokens "
                             f"and {batch.num_generation_rows} x {batch.generation_tokens} generation tokens")
        if not (batch.num_generation_rows and self.spec.count("M")):
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
        x = self.backbone.embeddings(input_ids)
        for block in self.backbone.layers:
            x = block(x, batch)
        return self.backbone.norm_f(x)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [M, D] -> [M, V] float32."""
        return self.lm_head(hidden).float()
