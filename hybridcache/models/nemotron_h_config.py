"""The fields of a `nemotron_h` config.json the model reads, validated; defaults as transformers' NemotronHConfig."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import UnsupportedConfigError
from .layers.mlp import ACTIVATIONS
from .spec_checks import build_spec, check_grouped_router, check_positive_ints

KIND_OF_BLOCK_TYPE = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
LEGACY_NAMES = {  # older config.json spellings -> current field names
    "mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_chunk_size": "chunk_size",
    "mamba_conv_bias": "use_conv_bias", "mamba_dt_min": "time_step_min",
}


@dataclass(frozen=True)
class NemotronHSpec:
    """`pattern` has one char per layer: `M` Mamba2, `*` attention, `-` MLP, `E` MoE."""

    pattern: str
    vocab_size: int = 131072
    hidden_size: int = 4096
    layer_norm_epsilon: float = 1e-5
    max_position_embeddings: int = 4096
    eos_token_id: int | list[int] | None = 2
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int | None = 128
    sliding_window: int | None = None
    intermediate_size: int = 21504
    mlp_hidden_act: str = "relu2"
    mlp_bias: bool = False
    mamba_num_heads: int = 128
    mamba_head_dim: int = 64
    mamba_hidden_act: str = "silu"
    n_groups: int = 8
    ssm_state_size: int = 128
    conv_kernel: int = 4
    chunk_size: int = 128
    use_conv_bias: bool = True
    use_bias: bool = False
    time_step_min: float = 0.001
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 7688
    moe_shared_expert_intermediate_size: int = 7688
    moe_latent_size: int | None = None
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "NemotronHSpec":
        raw = {LEGACY_NAMES.get(k, k): v for k, v in config.items() if v is not None or k == "head_dim"}
        return build_spec(cls, raw, pattern=_pattern(config))

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    def count(self, kind: str) -> int:
        return self.pattern.count(kind)

    def validate(self) -> None:
        """Raise UnsupportedConfigError on what the layers or kernels cannot serve."""
        check_positive_ints(self)
        if self.sliding_window is not None:
            raise UnsupportedConfigError("sliding_window", self.sliding_window, "sliding-window attention is not served")
        if self.mlp_hidden_act not in ACTIVATIONS:
            raise UnsupportedConfigError("mlp_hidden_act", self.mlp_hidden_act, f"supported: {sorted(ACTIVATIONS)}")
        if self.count("M"):
            if self.mamba_hidden_act != "silu":
                raise UnsupportedConfigError("mamba_hidden_act", self.mamba_hidden_act, "the conv kernel serves 'silu' only")
            if self.mamba_num_heads % self.n_groups:
                raise UnsupportedConfigError("n_groups", self.n_groups, f"must divide mamba_num_heads {self.mamba_num_heads}")
        if self.count("*") and self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedConfigError("num_key_value_heads", self.num_key_value_heads,
                                         f"must divide num_attention_heads {self.num_attention_heads}")
        if self.count("E"):
            check_grouped_router("n_routed_experts", self.n_routed_experts, self.n_group, self.topk_group,
                                 self.num_experts_per_tok)

def _pattern(config: dict[str, Any]) -> str:
    """Layer kinds from `layers_block_type` (current) or `hybrid_override_pattern` (older checkpoints)."""
    types = config.get("layers_block_type") or config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or any(t not in KIND_OF_BLOCK_TYPE for t in types):
            raise UnsupportedConfigError("layers_block_type", types, f"entries must be in {sorted(KIND_OF_BLOCK_TYPE)}")
        pattern = "".join(KIND_OF_BLOCK_TYPE[t] for t in types)
    else:
        pattern = config.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or any(c not in "M*-E" for c in pattern):
            raise UnsupportedConfigError("hybrid_override_pattern", pattern, "must be a string over 'M', '*', '-', 'E'")
    if not pattern:
        raise UnsupportedConfigError("layers_block_type", pattern, "the model has no layers")
    return pattern
