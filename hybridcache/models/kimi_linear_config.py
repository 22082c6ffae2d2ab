"""The fields of a `kimi_linear` config.json, validated; defaults and precedence as transformers' KimiLinearConfig.

A config.json comes in two spellings: the original checkpoint's (`linear_attn_config` with 1-indexed
`kda_layers` / `full_attn_layers`, `first_k_dense_replace`, `num_experts`, `moe_renormalize`, ...) and what
transformers' `save_pretrained` writes (the same plus `layer_types`, `mlp_layer_types`, `linear_head_dim`, ...).
Both are read. A field outside `READ`, `CHECKED` and `IGNORED` raises UnsupportedConfigError: the loader does
not serve what it does not understand.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .errors import UnsupportedConfigError
from .layers.mlp import ACTIVATIONS
from .spec_checks import build_spec, check_grouped_router, check_positive_ints

KDA, MLA = "linear_attention", "full_attention"
DENSE, SPARSE = "dense", "sparse"
ALIASES = {  # original checkpoint spelling -> transformers' attribute name
    "model_max_length": "max_position_embeddings", "moe_renormalize": "norm_topk_prob",
    "num_expert_group": "n_group", "num_experts": "num_local_experts",
    "num_experts_per_token": "num_experts_per_tok", "num_shared_experts": "n_shared_experts",
}
LINEAR_ATTN_KEYS = {"kda_layers", "full_attn_layers", "head_dim", "num_heads", "short_conv_kernel_size", "expand_v"}
# fields whose value must be the one the model serves: name -> (accepted values, reason)
CHECKED: dict[str, tuple[tuple[Any, ...], str]] = {
    "mla_use_nope": ((True,), "rotary MLA is not served (transformers applies no rotation either)"),
    "moe_layer_freq": ((1,), "only every layer after first_k_dense_replace may be MoE"),
    "moe_router_activation_func": (("sigmoid",), "the router scores with a sigmoid"),
    "scoring_func": (("sigmoid",), "the router scores with a sigmoid"),
    "pretraining_tp": ((1, None), "tensor-parallel pretraining slices are not served"),
    "use_grouped_topk": ((True, False), "must be a bool"),
    "topk_method": (("noaux_tc", "greedy", "group_limited_greedy", None), "unknown expert selection method"),
}
IGNORED = {  # do not change the math transformers runs
    "model_type", "architectures", "auto_map", "dtype", "torch_dtype", "transformers_version", "_name_or_path",
    "initializer_range", "use_cache", "output_router_logits", "router_aux_loss_coef", "attention_dropout",
    "pad_token_id", "bos_token_id", "rope_theta", "rope_scaling", "rope_parameters", "head_dim", "qk_head_dim",
    "num_nextn_predict_layers", "output_hidden_states", "output_attentions", "return_dict", "tokenizer_class",
    "tie_word_embeddings", "aux_loss_alpha", "seq_aux", "chunk_size_feed_forward", "id2label", "label2id",
}


@dataclass(frozen=True)
class KimiLinearSpec:
    """`kinds[i]` is "linear_attention" (KDA) or "full_attention" (MLA); `mlp_kinds[i]` "dense" or "sparse"."""

    kinds: tuple[str, ...]
    mlp_kinds: tuple[str, ...]
    vocab_size: int = 163840
    hidden_size: int = 2304
    intermediate_size: int = 9216
    moe_intermediate_size: int = 1024
    num_hidden_layers: int = 27
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 32
    n_shared_experts: int = 1
    routed_scaling_factor: float = 2.446
    kv_lora_rank: int = 512
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    qk_nope_head_dim: int = 128
    n_group: int = 1
    topk_group: int = 1
    num_experts_per_tok: int = 8
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    max_position_embeddings: int = 1048576
    rms_norm_eps: float = 1e-5
    eos_token_id: int | list[int] | None = 163586
    attention_bias: bool = False
    num_local_experts: int = 256
    linear_head_dim: int = 128
    linear_num_heads: int = 32
    linear_conv_kernel_dim: int = 4

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "KimiLinearSpec":
        raw = {ALIASES.get(k, k): v for k, v in config.items()}
        _check_known(raw)
        lin = raw.get("linear_attn_config") or {}
        if not isinstance(lin, dict) or set(lin) - LINEAR_ATTN_KEYS:
            raise UnsupportedConfigError("linear_attn_config", lin,
                                         f"must be an object with keys in {sorted(LINEAR_ATTN_KEYS)}")
        if lin.get("expand_v", 1) != 1:
            raise UnsupportedConfigError("linear_attn_config.expand_v", lin["expand_v"],
                                         "KDA q/k/v widths must be equal: the cache's conv role is one window over "
                                         "three equal sections")
        for key, name in (("head_dim", "linear_head_dim"), ("num_heads", "linear_num_heads"),
                          ("short_conv_kernel_size", "linear_conv_kernel_dim")):
            if key in lin:
                raw[name] = lin[key]
        layers = raw.get("num_hidden_layers", cls.num_hidden_layers)
        if type(layers) is not int or layers < 1:
            raise UnsupportedConfigError("num_hidden_layers", layers, "must be a positive integer")
        return build_spec(cls, raw, kinds=_layer_kinds(raw, lin, layers), mlp_kinds=_mlp_kinds(raw, layers))

    # ------------------------------------------------------------------ derived
    def count(self, kind: str) -> int:
        return self.kinds.count(kind)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def linear_width(self) -> int:
        """Width of each of the KDA q, k and v sections: heads x head_dim."""
        return self.linear_num_heads * self.linear_head_dim

    def validate(self) -> None:
        """Raise UnsupportedConfigError on what the layers or kernels cannot serve."""
        check_positive_ints(self, lambda name, value: name == "n_shared_experts" and value == 0)
        if self.num_key_value_heads not in (None, self.num_attention_heads):
            raise UnsupportedConfigError("num_key_value_heads", self.num_key_value_heads,
                                         f"MLA expands one latent to every head: must equal num_attention_heads "
                                         f"{self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise UnsupportedConfigError("hidden_act", self.hidden_act, f"supported: {sorted(ACTIVATIONS)}")
        if self.count(KDA) and self.hidden_act != "silu":
            raise UnsupportedConfigError("hidden_act", self.hidden_act, "the KDA short conv serves 'silu' only")
        if SPARSE in self.mlp_kinds:
            check_grouped_router("num_local_experts", self.num_local_experts, self.n_group, self.topk_group,
                                 self.num_experts_per_tok)

def _check_known(raw: dict[str, Any]) -> None:
    known = {f.name for f in fields(KimiLinearSpec)} | {"layer_types", "mlp_layer_types", "linear_attn_config",
                                                         "first_k_dense_replace"}
    for name, value in raw.items():
        if name in CHECKED:
            accepted, reason = CHECKED[name]
            if value not in accepted:
                raise UnsupportedConfigError(name, value, reason)
        elif name not in known and name not in IGNORED:
            raise UnsupportedConfigError(name, value, "unknown field: the kimi_linear loader does not know what it "
                                                      "means, so it cannot serve it")


def _layer_kinds(raw: dict[str, Any], lin: dict[str, Any], layers: int) -> tuple[str, ...]:
    """transformers' precedence: `layer_types`, else `linear_attn_config` (1-indexed), else MLA every 4th."""
    from_lin = None
    if "kda_layers" in lin and "full_attn_layers" in lin:
        kinds: list[str | None] = [None] * layers
        for key, kind in (("full_attn_layers", MLA), ("kda_layers", KDA)):
            numbers = lin[key]
            if not isinstance(numbers, list) or any(type(n) is not int or not 1 <= n <= layers for n in numbers):
                raise UnsupportedConfigError(f"linear_attn_config.{key}", numbers,
                                             f"must list 1-indexed layer numbers in [1, {layers}]")
            for n in numbers:
                kinds[n - 1] = kind
        if None in kinds:
            missing = [i + 1 for i, k in enumerate(kinds) if k is None]
            raise UnsupportedConfigError("linear_attn_config", lin, f"layers {missing} (1-indexed) have no kind")
        from_lin = tuple(kinds)
    types = raw.get("layer_types")
    if types is None:
        return from_lin or tuple(MLA if i and i % 4 == 0 else KDA for i in range(layers))
    if not isinstance(types, list) or len(types) != layers or any(t not in (KDA, MLA) for t in types):
        raise UnsupportedConfigError("layer_types", types, f"must list {layers} entries in {[KDA, MLA]}")
    if from_lin is not None and tuple(types) != from_lin:
        raise UnsupportedConfigError("layer_types", types, f"disagrees with linear_attn_config {lin}")
    return tuple(types)


def _mlp_kinds(raw: dict[str, Any], layers: int) -> tuple[str, ...]:
    types = raw.get("mlp_layer_types")
    if types is None:
        first_dense = raw.get("first_k_dense_replace", 1)
        if type(first_dense) is not int or first_dense < 0:
            raise UnsupportedConfigError("first_k_dense_replace", first_dense, "must be an integer >= 0")
        return tuple(DENSE if i < first_dense else SPARSE for i in range(layers))
    if not isinstance(types, list) or len(types) != layers or any(t not in (DENSE, SPARSE) for t in types):
        raise UnsupportedConfigError("mlp_layer_types", types, f"must list {layers} entries in {[DENSE, SPARSE]}")
    return tuple(types)
