"""Stacked routed experts: the sort-by-expert dispatch they share, and the non-gated and gated expert kinds."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .mlp import ACTIVATIONS
from .params import param


def dispatch(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, num_experts: int,
             expert: Callable[[int, torch.Tensor], torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """`sum_k weight[:, k] * expert(index[:, k], x)`. x: [N, Din]; index, weight: [N, k] -> [N, Dout] in `dtype`.

    Token copies are sorted by expert so that each expert runs once over its contiguous run (the run lengths
    are read on the host: one sync per layer). Expert outputs are stored in `dtype`, multiplied by the
    router weights in the promoted dtype of the two, and summed in `dtype`.
    """
    n, k = index.shape
    flat = index.flatten()
    order = flat.argsort(stable=True)
    token = order // k
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    xs = x[token]
    out = torch.empty(n * k, x.shape[1], device=x.device, dtype=dtype)
    start = 0
    for e, count in enumerate(counts):
        if count:
            out[start : start + count] = expert(e, xs[start : start + count])
        start += count
    out = out * weight.flatten()[order, None]
    return torch.zeros(n, x.shape[1], device=x.device, dtype=dtype).index_add_(0, token, out.to(dtype))


class Experts(nn.Module):
    """Non-gated experts `down(act(up(x)))`: up `[E, I, Din]`, down `[E, Din, I]`; checkpoints hold one tensor
    per expert (`{e}.up_proj.weight`, `{e}.down_proj.weight`). The output is summed in fp32."""

    def __init__(self, num_experts: int, d_in: int, inner: int, act: str,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.up = param(num_experts, inner, d_in, device=device, dtype=dtype)
        self.down = param(num_experts, d_in, inner, device=device, dtype=dtype)
        self.act = ACTIVATIONS[act]

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for e in range(self.up.shape[0]):
            out[f"{e}.up_proj.weight"] = self.up[e]
            out[f"{e}.down_proj.weight"] = self.down[e]
        return out

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.act(F.linear(x, self.up[e])), self.down[e])

    def forward(self, x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x: [N, Din]; index, weight: [N, k] -> sum_k weight * expert(x), [N, Din] fp32."""
        return dispatch(x, index, weight, self.up.shape[0], self._expert, torch.float32)


class GatedExperts(nn.Module):
    """Gated experts `down(act(gate(x)) * up(x))`: gate, up `[E, I, D]`, down `[E, D, I]`; checkpoints hold one
    tensor per expert and weight, `{e}.{name}.weight`, with `names` = the (gate, up, down) spellings
    (`gate_proj`, `up_proj`, `down_proj` by default; Kimi's are `w1`, `w3`, `w2`). The output is in x's dtype."""

    def __init__(self, num_experts: int, hidden: int, inner: int, act: str, device: torch.device | str,
                 dtype: torch.dtype, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")) -> None:
        super().__init__()
        self.gate = param(num_experts, inner, hidden, device=device, dtype=dtype)
        self.up = param(num_experts, inner, hidden, device=device, dtype=dtype)
        self.down = param(num_experts, hidden, inner, device=device, dtype=dtype)
        self.act, self.names = ACTIVATIONS[act], names

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        stacks = (self.gate, self.up, self.down)
        return {f"{e}.{n}.weight": t[e] for e in range(self.gate.shape[0]) for n, t in zip(self.names, stacks)}

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.act(F.linear(x, self.gate[e])) * F.linear(x, self.up[e]), self.down[e])

    def forward(self, x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x: [N, D]; index, weight: [N, k] -> sum_k weight * expert(x), [N, D] in x's dtype."""
        return dispatch(x, index, weight, self.gate.shape[0], self._expert, x.dtype)
