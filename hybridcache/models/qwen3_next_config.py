"""The fields of a `qwen3_next` config.json the model reads, validated; defaults as transformers' Qwen3NextConfig."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import UnsupportedConfigError
from .spec_checks import build_spec, check_positive_ints

LAYER_KINDS = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class Qwen3NextSpec:
    """`layer_types[i]` is "linear_attention" (Gated DeltaNet) or "full_attention" (gated GQA with partial RoPE).

    Older checkpoints give `full_attention_interval` (every n-th layer is attention) and top-level
    `rope_theta` / `partial_rotary_factor` instead of `layer_types` / `rope_parameters`.
    """

    layer_types: tuple[str, ...]
    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: int = 256
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    eos_token_id: int | list[int] | None = None
    attention_bias: bool = False
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    decoder_sparse_step: int = 1
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    num_experts_per_tok: int = 10
    num_experts: int = 512
    norm_topk_prob: bool = True
    mlp_only_layers: tuple[int, ...] = field(default_factory=tuple)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "Qwen3NextSpec":
        raw = {k: v for k, v in config.items() if v is not None}
        raw.update(_rope(config))
        if "mlp_only_layers" in raw:
            raw["mlp_only_layers"] = tuple(raw["mlp_only_layers"])
        return build_spec(cls, raw, layer_types=_layer_types(config))

    # ------------------------------------------------------------------ derived
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def count(self, kind: str) -> int:
        return self.layer_types.count(kind)

    def is_moe(self, layer: int) -> bool:
        """As transformers decides a decoder layer's MLP: sparse unless listed in `mlp_only_layers`."""
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)

    def validate(self) -> None:
        """Raise UnsupportedConfigError on what the layers or kernels cannot serve."""
        check_positive_ints(self, lambda name, value: name == "num_experts")  # 0: no MoE layers
        if self.hidden_act != "silu":
            raise UnsupportedConfigError("hidden_act", self.hidden_act, "the GDN conv kernel serves 'silu' only")
        if self.count("linear_attention") and self.linear_num_value_heads % self.linear_num_key_heads:
            raise UnsupportedConfigError("linear_num_value_heads", self.linear_num_value_heads,
                                         f"must be a multiple of linear_num_key_heads {self.linear_num_key_heads}")
        if self.count("full_attention"):
            if self.num_attention_heads % self.num_key_value_heads:
                raise UnsupportedConfigError("num_key_value_heads", self.num_key_value_heads,
                                             f"must divide num_attention_heads {self.num_attention_heads}")
            if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
                raise UnsupportedConfigError("partial_rotary_factor", self.partial_rotary_factor,
                                             f"head_dim {self.head_dim} x factor must be an even width in (0, head_dim]")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise UnsupportedConfigError("num_experts_per_tok", self.num_experts_per_tok,
                                         f"must be in [1, num_experts {self.num_experts}]")


def _layer_types(config: dict[str, Any]) -> tuple[str, ...]:
    types = config.get("layer_types")
    if types is None:
        n, every = config.get("num_hidden_layers", 48), config.get("full_attention_interval", 4)
        if type(n) is not int or n < 1 or type(every) is not int or every < 1:
            raise UnsupportedConfigError("full_attention_interval", every, "needs positive num_hidden_layers and interval")
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    if not isinstance(types, list) or not types or any(t not in LAYER_KINDS for t in types):
        raise UnsupportedConfigError("layer_types", types, f"must be a non-empty list over {list(LAYER_KINDS)}")
    n = config.get("num_hidden_layers", len(types))
    if n != len(types):
        raise UnsupportedConfigError("layer_types", types, f"has {len(types)} entries for num_hidden_layers {n}")
    return tuple(types)


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    """rope_theta / partial_rotary_factor from `rope_parameters` (5.x) or the top level (older files)."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise UnsupportedConfigError("rope_parameters", params, "only the default RoPE is served")
    out = {}
    for name in ("rope_theta", "partial_rotary_factor"):
        value = params.get(name, config.get(name))
        if value is not None:
            out[name] = float(value)
    return out
