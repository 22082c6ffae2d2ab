"""A recurrent mixer's input projection and its causal conv, as one launch where a step decodes one row."""
from __future__ import annotations

import torch

from ...ops.conv1d.epilogue import ConvEpilogue
from ...ops.linear import folds_conv, linear, linear_conv
from ..batch import ForwardBatch


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, batch: ForwardBatch, start: int,
            conv_weight: torch.Tensor, conv_bias: torch.Tensor | None, conv: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """x [N, D] @ weight.T (+ bias) -> (out [N, out], conv_done). Where the batch is one decode row (one token,
    no context rows) on the one-row gemv, out's columns start .. start + C come out through the row's causal conv
    update with silu (taps conv_weight [C, WIDTH], conv_bias [C] or None, the conv role [S, C, W + k], its window
    shifted: `linear_conv`, one launch for two) and conv_done is True; otherwise out is the plain projection and
    the caller runs the conv."""
    if batch.num_context_rows == 0 and batch.num_rows == 1 and batch.generation_tokens == 1 and folds_conv(x):
        return linear_conv(x, weight, bias, ConvEpilogue(start, conv_weight, conv_bias, conv, batch.slots)), True
    return linear(x, weight, bias), False
