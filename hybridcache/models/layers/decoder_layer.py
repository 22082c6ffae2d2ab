"""The pre-norm decoder layer of Qwen3-Next and Kimi Linear: a token mixer, then a feed-forward."""
from __future__ import annotations

import torch
from torch import nn

from ...parallel import SINGLE, TPGroup
from ..batch import ForwardBatch


class DecoderLayer(nn.Module):
    """`h = x + mixer(input_layernorm(x)); h + mlp(post_attention_layernorm(h))`.

    The mixer (read with the ForwardBatch) is registered under `mixer_name`, as checkpoints name it
    (`self_attn`, `linear_attn`); `kind` is the layer kind it serves. Under tensor parallelism the mixer
    and the MLP return partial sums: one all-reduce each.
    """

    def __init__(self, kind: str, mixer_name: str, mixer: nn.Module, mlp: nn.Module, input_layernorm: nn.Module,
                 post_attention_layernorm: nn.Module, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.kind, self.mixer_name, self.tp = kind, mixer_name, tp
        self.add_module(mixer_name, mixer)
        self.mlp = mlp
        self.input_layernorm, self.post_attention_layernorm = input_layernorm, post_attention_layernorm

    @property
    def mixer(self) -> nn.Module:
        return getattr(self, self.mixer_name)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """x: [N, D] -> [N, D]."""
        x, out = self.residual(x, None, batch)
        return x + out

    def residual(self, x: torch.Tensor, delta: torch.Tensor | None, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer on the stream x + delta (delta None: x), returned as (stream, the MLP's output) whose sum
        is the layer's output: each residual add is fused into the norm after it (`RMSNorm.add`); a mixture of
        experts' router may run the second (`add_norm_route`, `ops/moe.FOLD_NORM`)."""
        h, x = self.input_layernorm.add(x, delta)
        out = self.tp.all_reduce(self.mixer(h, batch))
        routed = None
        if hasattr(self.mlp, "forward_routed"):
            routed = self.mlp.gate.add_norm_route(x, out, self.post_attention_layernorm)
        if routed is None:
            h, x = self.post_attention_layernorm.add(x, out)
            return x, self.tp.all_reduce(self.mlp(h))
        h, x, index, weight = routed
        return x, self.tp.all_reduce(self.mlp.forward_routed(h, index, weight))
