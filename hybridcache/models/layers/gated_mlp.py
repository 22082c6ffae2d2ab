"""Gated (SwiGLU-style) MLP `down(act(gate(x)) * up(x))`, gate and up as one GEMM."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.moe import SharedExpert
from ...ops.linear import linear, silu_mul
from ...parallel import SINGLE, TPGroup, head_share
from ...parallel.linear import RowParallelLinear
from .attention import fused_rows
from .mlp import ACTIVATIONS
from .params import param

ALIGN_ROWS = 8  # 16 bytes of a 16-bit output row


class GatedMLP(nn.Module):
    """gate_proj, up_proj `[I, D]`, down_proj `[D, I]`, no bias. gate_proj and up_proj are the first rows of
    one `gate_up_weight` (checkpoint names stay views of it, `attention.fused_rows`); `extra_rows` more rows
    are another module's projection of the same x, computed in the same GEMM (`forward_extra`; that module
    names them), then zero rows up to a multiple of ALIGN_ROWS (a GEMM output row of 2I + 1 columns would
    leave every row of it off 16-byte alignment, which the fast GEMM kernels need). Under tensor
    parallelism gate/up are column-parallel and down row-parallel over I: the output is this rank's partial
    sum."""

    def __init__(self, hidden: int, inner: int, act: str, device: torch.device | str, dtype: torch.dtype,
                 tp: TPGroup = SINGLE, extra_rows: int = 0) -> None:
        super().__init__()
        part = head_share(tp, inner, "the gated MLP's intermediate size")
        self.rows = [("gate_proj", inner, part), ("up_proj", inner, part)]
        self.inner = part[1]  # this rank's
        self.extra_rows = extra_rows
        padded = -(-extra_rows // ALIGN_ROWS) * ALIGN_ROWS
        self.gate_up_weight = param(2 * self.inner + padded, hidden, device=device, dtype=dtype)
        with torch.no_grad():
            self.gate_up_weight[2 * self.inner + extra_rows :].zero_()  # never loaded
        self.down_proj = RowParallelLinear(inner, [part], hidden, False, tp, device, dtype)
        self.act_name, self.act = act, ACTIVATIONS[act]

    @property
    def gate_weight(self) -> torch.Tensor:
        return self.gate_up_weight[: self.inner]

    @property
    def up_weight(self) -> torch.Tensor:
        return self.gate_up_weight[self.inner : 2 * self.inner]

    @property
    def extra_weight(self) -> torch.Tensor:
        return self.gate_up_weight[2 * self.inner : 2 * self.inner + self.extra_rows]

    def as_shared_expert(self, gate_logit: bool = False) -> SharedExpert:
        """These weights as a mixture's shared expert for the experts' kernels (views, no copy); `gate_logit`:
        scaled by sigmoid of the first extra row's projection (Qwen3-Next's shared_expert_gate)."""
        return SharedExpert(self.up_weight, self.down_proj.weight, self.gate_weight,
                            self.extra_weight[0] if gate_logit else None)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        return fused_rows(self.rows, self.gate_up_weight[: 2 * self.inner], None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, D] -> [N, D] (partial under tensor parallelism)."""
        return self.forward_extra(x)[0]

    def forward_extra(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [N, D] -> (the MLP's output [N, D], the extra rows' projection of x [N, extra_rows], a view)."""
        I = self.inner
        h = linear(x, self.gate_up_weight)
        inner = silu_mul(h, I) if self.act_name == "silu" else self.act(h[:, :I]) * h[:, I : 2 * I]
        return self.down_proj(inner), h[:, 2 * I : 2 * I + self.extra_rows]
