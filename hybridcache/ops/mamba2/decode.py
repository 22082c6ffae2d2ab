"""Single-token Mamba2 step (selective state update) through slots: the Triton kernel on CUDA
(`triton_decode.py`), else vectorized torch (gather the rows, update, scatter them back)."""

from __future__ import annotations

import torch
from torch import Tensor

from hybridcache.ops.slot_io import put_rows, take_rows
from hybridcache.ops.mamba2.common import NO_LIMIT, DtLimit, add_skip, check_dims, process_dt
from hybridcache.ops.triton_support import runs_triton


def mamba2_decode(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    slots: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
) -> Tensor:
    """See `mamba2_decode_ref`. x: [B, H, P]; dt: [B, H]; B, C: [B, G, N]; ssm: [S, H, P, N] fp32,
    updated in place (padding rows write nothing). Returns y: [B, H, P] in x's dtype."""
    if runs_triton(x):
        from hybridcache.ops.mamba2.triton_decode import mamba2_decode_triton

        return mamba2_decode_triton(x, dt, A, B, C, ssm, slots, D, dt_bias, dt_limit)
    return mamba2_decode_torch(x, dt, A, B, C, ssm, slots, D, dt_bias, dt_limit)


def mamba2_decode_torch(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    slots: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
) -> Tensor:
    """`mamba2_decode` in torch ops on any device: gather the slots' rows, update them, scatter them back."""
    batch = x.shape[0]
    heads, head_dim, groups, dstate, reps = check_dims(x, B, ssm)
    valid = slots >= 0
    dtp = process_dt(dt, dt_bias, dt_limit)  # [B, H]
    h = take_rows(ssm, slots, valid).view(batch, groups, reps, head_dim, dstate)
    h.mul_(torch.exp(dtp * A.float()).view(batch, groups, reps, 1, 1))
    xdt = (x.float() * dtp[..., None]).view(batch, groups, reps, head_dim, 1)
    h.addcmul_(xdt, B.float().view(batch, groups, 1, 1, dstate))
    y = add_skip(torch.einsum("bgrpn,bgn->bgrp", h, C.float()).reshape(batch, heads, head_dim), x, D)
    put_rows(ssm, (slots,), h.view(batch, heads, head_dim, dstate), valid)
    return y.to(x.dtype)
