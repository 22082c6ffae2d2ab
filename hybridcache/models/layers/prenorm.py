"""A pre-norm sublayer's front: the residual add, the norm and the module after it, the norm folded into the
module's first GEMM where that runs as one launch (one row, `ops/linear.py` FUSE_NORM).

A module that starts with one GEMM of its whole input exposes it as `input_projection` (weight [O, D], bias
[O] or None) and its remainder as `forward_projected(projected, *args)`: `forward(x, *args)` is
`forward_projected(linear(x, *input_projection), *args)`. A mixture of experts whose router (`gate`) computes
its logits in its kernel exposes `forward_routed(x, index, weight)`, and the router folds the norm in
(`add_norm_route`: the normalised rows for the experts come out of the same launch). Where no fold runs, the
module's own `forward` runs (hooks and subclasses see it as before)."""
from __future__ import annotations

import torch
from torch import nn

from ...ops.linear import fuses_norm
from .norm import RMSNorm


def prenorm(norm: RMSNorm, module: nn.Module, x: torch.Tensor, delta: torch.Tensor | None,
            *args) -> tuple[torch.Tensor, torch.Tensor]:
    """(module(norm(x + delta), *args), x + delta); delta None: no add."""
    if fuses_norm(x):
        if hasattr(module, "input_projection"):
            from ...ops.gemv_triton import add_rms_norm_gemv_triton  # triton is imported only where it runs

            projected, x = add_rms_norm_gemv_triton(x, delta, norm.weight, norm.eps, norm.zero_centred,
                                                    *module.input_projection)
            return module.forward_projected(projected, *args), x
        routed = module.gate.add_norm_route(x, delta, norm) if hasattr(module, "forward_routed") else None
        if routed is not None:
            h, x, index, weight = routed
            return module.forward_routed(h, index, weight, *args), x
    h, x = norm.add(x, delta)
    return module(h, *args), x
