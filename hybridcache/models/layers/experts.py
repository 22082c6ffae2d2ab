"""Stacked routed experts: the sort-by-expert dispatch they share, and the non-gated and gated expert kinds."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.moe import MAX_PAIRS, MAX_SORTED_PAIRS, SharedExpert, pairs
from ...ops.moe.sort import sort_by_expert
from ...ops.triton_support import runs_triton
from ...parallel import SINGLE, TPGroup, head_share, shard
from .mlp import ACTIVATIONS
from .params import param


def grouped_supported(x: torch.Tensor, *widths: int) -> bool:
    """Whether `torch._grouped_mm` takes these operands: row strides of 16-byte multiples, a dtype it has
    kernels for on this device (CUDA: bf16 on compute capability 9.0 and above)."""
    if not hasattr(torch, "_grouped_mm") or any(w * x.element_size() % 16 for w in widths):
        return False
    if x.device.type == "cuda":
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (9, 0)
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16)


def linear_grouped(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """`F.linear(x[run e], weight[e])` for each expert's run of rows. x: [M, Din]; weight: [E, Dout, Din]."""
    return torch._grouped_mm(x, weight.transpose(1, 2), offs=ends)


DENSE_LIMIT = 4096  # token rows x experts up to which a device without grouped GEMMs runs every expert on every row


def dense(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, num_experts: int,
          expert: Callable[[int, torch.Tensor], torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """`dispatch` without sorting and without reading anything on the host: every expert runs on every row
    (num_experts / k times the routed work), then each row keeps its k experts' outputs. For small batches
    on a device with no grouped GEMM for x's dtype (fp32 on CUDA), so that decode steps stay capturable in
    CUDA graphs. x: [N, Din]; index, weight: [N, k] -> [N, Dout] in `dtype`."""
    n = x.shape[0]
    every = torch.stack([expert(e, x).to(dtype) for e in range(num_experts)])  # [E, N, Dout]
    chosen = every[index, torch.arange(n, device=x.device)[:, None]]  # [N, k, Dout]
    out = chosen * weight[..., None]
    total = torch.zeros(n, every.shape[-1], device=x.device, dtype=dtype)
    for j in range(index.shape[1]):  # in k order, each product rounded to dtype first, as dispatch's sum
        total = total + out[:, j].to(dtype)
    return total


def dispatch(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, num_experts: int,
             expert: Callable[[int, torch.Tensor], torch.Tensor], dtype: torch.dtype,
             grouped: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """`sum_k weight[:, k] * expert(index[:, k], x)`. x: [N, Din]; index, weight: [N, k] -> [N, Dout] in `dtype`.

    Token copies are sorted by expert. With `grouped(xs, ends)` every expert runs in one grouped GEMM per
    weight and nothing is read on the host; otherwise each expert runs once over its contiguous run (the
    run lengths are read on the host: one sync per layer), except small batches on CUDA, which run `dense`. Expert outputs are stored in `dtype`,
    multiplied by the router weights in the promoted dtype of the two, and summed in `dtype`.
    """
    n, k = index.shape
    if grouped is None and x.device.type == "cuda" and n * num_experts <= DENSE_LIMIT:
        return dense(x, index, weight, num_experts, expert, dtype)
    order, token, ends = sort_by_expert(index, num_experts)
    xs = x[token]
    if grouped is not None:
        out = grouped(xs, ends).to(dtype)
    else:
        out = torch.empty(n * k, x.shape[1], device=x.device, dtype=dtype)
        start = 0
        for e, end in enumerate(ends.tolist()):
            if end > start:
                out[start:end] = expert(e, xs[start:end])
            start = end
    out = out * weight.flatten()[order, None]
    return torch.zeros(n, x.shape[1], device=x.device, dtype=dtype).index_add_(0, token, out.to(dtype))


# A shared expert of several parts runs slower in the sorted kernels than on its own at few tokens: the whole
# qwen3_next MoE layer (shared expert 4 parts wide, with its gate) folded against on its own, us (H100,
# benchmarks/ops_moe.py): 4 tokens 48.3 / 44.3, 16: 62.0 / 52.2, 32: 80.0 / 55.0, 64: 55.9 / 62.6 (H200, a session
# before: 16: 64.6 / 48.6, 64: 56.0 / 59.2). One part (kimi_linear) folded was faster at every count timed.
FOLD_SORTED_FROM = 64


def fused(x: torch.Tensor, index: torch.Tensor, inner: int, shared: SharedExpert | None = None) -> bool:
    """Whether the experts run as fused Triton kernels (`ops/moe/fused.py`): where Triton runs, for up to
    MAX_SORTED_PAIRS token copies (decode, verify; `pairs` counts a shared expert's parts too); the same
    roundings as `dispatch` (the kernels' docstring)."""
    return runs_triton(x) and 0 < pairs(index, inner, shared) <= MAX_SORTED_PAIRS


class Experts(nn.Module):
    """Non-gated experts `down(act(up(x)))`: up `[E, I, Din]`, down `[E, Din, I]`; checkpoints hold one tensor
    per expert (`{e}.up_proj.weight`, `{e}.down_proj.weight`). The output is summed in fp32.

    Tensor parallelism is expert-internal: every rank holds every expert with its share of I (up column-,
    down row-parallel), routes every token as the others do, and returns its partial sum."""

    def __init__(self, num_experts: int, d_in: int, inner: int, act: str,
                 device: torch.device | str, dtype: torch.dtype, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.inner, self.part = inner, head_share(tp, inner, "the experts' intermediate size")
        self.up = param(num_experts, self.part[1], d_in, device=device, dtype=dtype)
        self.down = param(num_experts, d_in, self.part[1], device=device, dtype=dtype)
        self.act, self.act_name = ACTIVATIONS[act], act

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for e in range(self.up.shape[0]):
            out[f"{e}.up_proj.weight"] = shard(self.up[e], 0, self.inner, self.part)
            out[f"{e}.down_proj.weight"] = shard(self.down[e], 1, self.inner, self.part)
        return out

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.act(F.linear(x, self.up[e])), self.down[e])

    def _grouped(self, xs: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        return linear_grouped(self.act(linear_grouped(xs, self.up, ends)), self.down, ends)

    def forward(self, x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x: [N, Din]; index, weight: [N, k] -> sum_k weight * expert(x), [N, Din] fp32."""
        if fused(x, index, self.up.shape[1]):
            from ...ops.moe.fused import fused_experts  # triton is imported only where it runs
            return fused_experts(x, index, weight, self.up, self.down, None, self.act_name, torch.float32)
        grouped = self._grouped if grouped_supported(x, *self.up.shape[1:]) else None
        return dispatch(x, index, weight, self.up.shape[0], self._expert, torch.float32, grouped)


class GatedExperts(nn.Module):
    """Gated experts `down(act(gate(x)) * up(x))`: gate, up `[E, I, D]`, down `[E, D, I]`; checkpoints hold one
    tensor per expert and weight, `{e}.{name}.weight`, with `names` = the (gate, up, down) spellings
    (`gate_proj`, `up_proj`, `down_proj` by default; Kimi's are `w1`, `w3`, `w2`). The output is in x's dtype.
    Tensor parallelism is expert-internal, as `Experts`."""

    def __init__(self, num_experts: int, hidden: int, inner: int, act: str, device: torch.device | str,
                 dtype: torch.dtype, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
                 tp: TPGroup = SINGLE) -> None:
        super().__init__()
        self.inner, self.part = inner, head_share(tp, inner, "the experts' intermediate size")
        self.gate = param(num_experts, self.part[1], hidden, device=device, dtype=dtype)
        self.up = param(num_experts, self.part[1], hidden, device=device, dtype=dtype)
        self.down = param(num_experts, hidden, self.part[1], device=device, dtype=dtype)
        self.act, self.act_name, self.names = ACTIVATIONS[act], act, names

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for e in range(self.gate.shape[0]):
            for n, t, dim in zip(self.names, (self.gate, self.up, self.down), (0, 0, 1)):
                out[f"{e}.{n}.weight"] = shard(t[e], dim, self.inner, self.part)
        return out

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.act(F.linear(x, self.gate[e])) * F.linear(x, self.up[e]), self.down[e])

    def _grouped(self, xs: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        gate, up = linear_grouped(xs, self.gate, ends), linear_grouped(xs, self.up, ends)
        return linear_grouped(self.act(gate) * up, self.down, ends)

    def takes_shared(self, x: torch.Tensor, index: torch.Tensor, shared: SharedExpert) -> bool:
        """Whether `forward(x, index, weight, shared=shared)` can run: the fused kernels take these tokens with
        the shared expert's parts, and it is laid out as a multiple of one of these (the caller has checked
        that it computes the same activation)."""
        return fused(x, index, self.gate.shape[1], shared) and shared.fits(self.up, self.down, self.gate)

    def folds_shared(self, x: torch.Tensor, index: torch.Tensor, shared: SharedExpert) -> bool:
        """Whether the MoE layers run `shared` in the experts' kernels: where `takes_shared`, but a shared expert
        of several parts (S / I > 1) only in the one-pair kernels or from FOLD_SORTED_FROM tokens (in between
        it is faster on its own)."""
        if not self.takes_shared(x, index, shared):
            return False
        inner = self.gate.shape[1]
        return (shared.parts(inner) == 1 or pairs(index, inner, shared) <= MAX_PAIRS
                or x.shape[0] >= FOLD_SORTED_FROM)

    def forward(self, x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor,
                shared: SharedExpert | None = None) -> torch.Tensor:
        """x: [N, D]; index, weight: [N, k] -> sum_k weight * expert(x), [N, D] in x's dtype.

        `shared` (where `takes_shared`): a shared expert run in the same kernels as more pairs a token, its
        output (times sigmoid of its gate logit, where it has one) added last, rounded as the callers'
        `routed + shared(x)` and `routed + sigmoid(logit) * shared(x)` in x's dtype."""
        if shared is not None:
            if not self.takes_shared(x, index, shared):
                raise ValueError("this shared expert does not run in the experts' kernels here (takes_shared)")
            from ...ops.moe.fused import fused_experts
            return fused_experts(x, index, weight, self.up, self.down, self.gate, self.act_name, x.dtype, shared=shared)
        if fused(x, index, self.gate.shape[1]):
            from ...ops.moe.fused import fused_experts
            return fused_experts(x, index, weight, self.up, self.down, self.gate, self.act_name, x.dtype)
        grouped = self._grouped if grouped_supported(x, *self.gate.shape[1:]) else None
        return dispatch(x, index, weight, self.gate.shape[0], self._expert, x.dtype, grouped)
