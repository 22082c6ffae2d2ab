"""NemotronH hybrid (HF `model_type` "nemotron_h"): pre-norm residual blocks of Mamba2, GQA attention
(no positional rotation), relu² MLP and MoE layers in any pattern, over the cache manager's roles."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..parallel import SINGLE, TPGroup, group_share, head_share
from ..parallel.pipeline import Stage, whole
from ..states import KVPages, Mamba2State
from .batch import ForwardBatch
from .hybrid_lm import Device, HybridLM, Trunk
from .layers.attention import PagedGQAAttention, kv_share
from .layers.embedding import Embedding
from .layers.mamba2_mixer import STATE_NAME, Mamba2Mixer
from .layers.mlp import MLP, Linear
from .layers.moe import MoE
from .layers.norm import RMSNorm
from .nemotron_h_config import NemotronHSpec
from .registry import register


def _mamba(s: NemotronHSpec, index: int, device: Device, dtype: torch.dtype, tp: TPGroup) -> nn.Module:
    # transformers' mixer clamps dt below at time_step_min (not config.time_step_limit); so do we
    return Mamba2Mixer(index, s.hidden_size, s.mamba_num_heads, s.mamba_head_dim, s.n_groups, s.ssm_state_size,
                       s.conv_kernel, s.chunk_size, (s.time_step_min, float("inf")), s.layer_norm_epsilon,
                       s.use_bias, s.use_conv_bias, device, dtype, tp)


def _attention(s: NemotronHSpec, index: int, device: Device, dtype: torch.dtype, tp: TPGroup) -> nn.Module:
    return PagedGQAAttention(index, s.hidden_size, s.num_attention_heads, s.num_key_value_heads,
                             s.attn_head_dim, False, device, dtype, tp)


def _mlp(s: NemotronHSpec, index: int, device: Device, dtype: torch.dtype, tp: TPGroup) -> nn.Module:
    return MLP(s.hidden_size, s.intermediate_size, s.mlp_hidden_act, s.mlp_bias, device, dtype, tp)


def _moe(s: NemotronHSpec, index: int, device: Device, dtype: torch.dtype, tp: TPGroup) -> nn.Module:
    return MoE(s.hidden_size, s.n_routed_experts, s.num_experts_per_tok, s.moe_intermediate_size,
               s.moe_shared_expert_intermediate_size, s.moe_latent_size, s.mlp_hidden_act, s.mlp_bias,
               s.n_group, s.topk_group, s.norm_topk_prob, s.routed_scaling_factor, device, dtype, tp)


# kind -> (builder, whether the mixer reads the ForwardBatch)
MIXERS: dict[str, tuple[Callable[..., nn.Module], bool]] = {
    "M": (_mamba, True), "*": (_attention, True), "-": (_mlp, False), "E": (_moe, False),
}


class Block(nn.Module):
    """`x + mixer(norm(x))`; under tensor parallelism the mixer returns a partial sum, all-reduced here."""

    def __init__(self, kind: str, mixer: nn.Module, norm: RMSNorm, reads_batch: bool, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.kind, self.reads_batch, self.tp = kind, reads_batch, tp
        self.norm, self.mixer = norm, mixer

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        x, out = self.residual(x, None, batch)
        return x + out

    def residual(self, x: torch.Tensor, delta: torch.Tensor | None, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The block on the stream x + delta (delta None: x), as (stream, mixer output): the residual add is
        fused into the norm of the block after it (`RMSNorm.add`)."""
        h, x = self.norm.add(x, delta)
        return x, self.tp.all_reduce(self.mixer(h, batch) if self.reads_batch else self.mixer(h))


def _blocks(s: NemotronHSpec, device: Device, dtype: torch.dtype, tp: TPGroup, stage: Stage) -> dict[int, Block]:
    """One block per pattern char of the stage, by layer number; a mixer's index counts the stage's layers
    of its kind before it."""
    seen = {kind: 0 for kind in MIXERS}
    blocks = {}
    for i, kind in enumerate(s.pattern):
        if i not in stage:
            continue
        build, reads_batch = MIXERS[kind]
        mixer = build(s, seen[kind], device, dtype, tp)
        seen[kind] += 1
        blocks[i] = Block(kind, mixer, RMSNorm(s.hidden_size, s.layer_norm_epsilon, device, dtype), reads_batch, tp)
    return blocks


@register("nemotron_h")
class NemotronH(HybridLM):
    """Checkpoint names: `backbone.embeddings.weight`, `backbone.layers.{i}.norm.weight`,
    `backbone.layers.{i}.mixer.*`, `backbone.norm_f.weight`, `lm_head.weight`; a `model.` prefix is accepted
    for `backbone.`. The LM head is never tied to the embeddings (transformers' NemotronH does not tie either,
    whatever `tie_word_embeddings` says)."""

    spec_type = NemotronHSpec
    recurrent_kind, attention_kind, state_name = "M", "*", STATE_NAME

    def __init__(self, spec: NemotronHSpec, device: Device = "cpu", dtype: torch.dtype = torch.float32,
                 tp: TPGroup = SINGLE, stage: Stage | None = None) -> None:
        stage = stage or whole(len(spec.pattern))
        first, last = stage.is_first, stage.is_last
        trunk = Trunk("embeddings", Embedding(spec.vocab_size, spec.hidden_size, device, dtype) if first else None,
                      _blocks(spec, device, dtype, tp, stage), "norm_f",
                      RMSNorm(spec.hidden_size, spec.layer_norm_epsilon, device, dtype) if last else None)
        head = Linear(spec.hidden_size, spec.vocab_size, False, device, dtype) if last else None
        super().__init__(spec, "backbone", trunk, head, dtype, tp, stage)

    @staticmethod
    def layer_kinds_of(spec: NemotronHSpec) -> str:
        return spec.pattern

    @staticmethod
    def checkpoint_names(name: str) -> list[str]:
        """Spellings of one tensor's name a checkpoint may use."""
        if name.startswith("backbone."):
            return [name, "model." + name[len("backbone."):]]
        return [name]

    def recurrent_state(self, num_layers: int, num_draft_tokens: int, hist: int | None = None) -> Mamba2State:
        """This rank's heads and groups (all of them for one rank)."""
        s = self.spec
        heads = head_share(self.tp, s.mamba_num_heads, "mamba_num_heads")[1]
        groups = group_share(self.tp, s.n_groups, s.mamba_num_heads, "n_groups")[1]
        return Mamba2State(num_layers, heads, s.mamba_head_dim, groups, s.ssm_state_size,
                           s.conv_kernel, dtype=self.dtype, num_draft_tokens=num_draft_tokens, hist=hist)

    def attention_pages(self, num_layers: int, page_size: int) -> KVPages:
        s = self.spec
        kv_heads = kv_share(self.tp, s.num_attention_heads, s.num_key_value_heads)[1]
        return KVPages(num_layers, kv_heads, s.attn_head_dim, page_size, self.dtype)
