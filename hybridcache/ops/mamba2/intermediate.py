"""The per-token intermediate-state alternative to replay, for the benchmark and as a cross-check.

Verify computes all T states from the checkpoint and writes them to an `inter [S, T, H, P, N]` fp32
role; accept copies state v - 1 back into the checkpoint (what SGLang does; vLLM instead keeps 1 + k
states per request and picks by index). Vectorized like the replay path, no host sync.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybridcache.ops.slot_io import put_rows, take_rows
from hybridcache.ops.mamba2.common import NO_LIMIT, DtLimit, add_skip, causal_decay, check_dims, process_dt
from hybridcache.ops.triton_support import runs_triton


def mamba2_verify_intermediate(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    inter: Tensor,
    slots: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
) -> Tensor:
    """x: [B, T, H, P]; dt: [B, T, H]; B, C: [B, T, G, N]; ssm: [S, H, P, N] (read);
    inter: [S, T_max, H, P, N] fp32 (states after each new token written at [0, T)).
    Returns y: [B, T, H, P] in x's dtype. Padding rows (slot < 0) run from a zero state and write nothing."""
    if runs_triton(x):
        from hybridcache.ops.mamba2.triton_decode import mamba2_verify_intermediate_triton

        return mamba2_verify_intermediate_triton(x, dt, A, B, C, ssm, inter, slots, D, dt_bias, dt_limit)
    return mamba2_verify_intermediate_torch(x, dt, A, B, C, ssm, inter, slots, D, dt_bias, dt_limit)


def mamba2_verify_intermediate_torch(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    inter: Tensor,
    slots: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
) -> Tensor:
    """`mamba2_verify_intermediate` in torch ops on any device: all T states at once in closed form."""
    batch, steps = x.shape[:2]
    heads, head_dim, groups, dstate, reps = check_dims(x, B, ssm)
    valid = slots >= 0
    h0 = take_rows(ssm, slots, valid).view(batch, 1, groups, reps, head_dim, dstate)
    dtp = process_dt(dt, dt_bias, dt_limit)  # [B, T, H]
    cum = torch.cumsum(dtp * A.float(), dim=1).transpose(1, 2)  # [B, H, T]
    weight = (causal_decay(cum) * dtp.transpose(1, 2)[:, :, None, :]).view(batch, groups, reps, steps, steps)
    xs = x.float().view(batch, steps, groups, reps, head_dim)
    xw = torch.einsum("bgrts,bsgrp->btgrsp", weight, xs)
    states = torch.einsum("btgrsp,bsgn->btgrpn", xw, B.float())
    states += h0 * torch.exp(cum).transpose(1, 2).reshape(batch, steps, groups, reps, 1, 1)
    y = add_skip(torch.einsum("btgn,btgrpn->btgrp", C.float(), states).reshape(batch, steps, heads, head_dim), x, D)
    t = torch.arange(steps, device=x.device)
    put_rows(inter, (slots[:, None], t[None]), states.reshape(batch, steps, heads, head_dim, dstate), valid)
    return y.to(x.dtype)


def mamba2_accept_intermediate(ssm: Tensor, inter: Tensor, slots: Tensor, num_valid: Tensor) -> None:
    """ssm[slot] = inter[slot, v - 1] per row. num_valid: [B] (1 <= v <= T)."""
    valid = slots >= 0
    pick = inter[slots.clamp_min(0), (num_valid.long() - 1).clamp_min(0)]  # [B, H, P, N]
    put_rows(ssm, (slots,), pick, valid)
