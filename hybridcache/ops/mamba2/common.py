"""Small pieces every Mamba2 path shares: dt processing, shape checks, group-to-head expansion, the D skip."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

DtLimit = tuple[float, float]
NO_LIMIT: DtLimit = (0.0, float("inf"))


def process_dt(dt: Tensor, dt_bias: Tensor | None, dt_limit: DtLimit = NO_LIMIT) -> Tensor:
    """softplus(dt + dt_bias) clamped to dt_limit, in fp32. dt: [..., H]; dt_bias: [H] or None."""
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    dt = F.softplus(dt)
    return dt.clamp(min=dt_limit[0], max=dt_limit[1])


def heads_of_groups(t: Tensor, num_heads: int) -> Tensor:
    """[..., G, N] -> [..., H, N]: head h reads group h // (H // G)."""
    groups = t.shape[-2]
    if num_heads % groups:
        raise ValueError(f"num_heads {num_heads} is not a multiple of ngroups {groups}")
    return t.repeat_interleave(num_heads // groups, dim=-2)


def check_state(ssm: Tensor, num_heads: int, head_dim: int, state_size: int) -> None:
    """ssm must be the fp32 [S, H, P, N] slice of one layer."""
    if ssm.dtype != torch.float32:
        raise ValueError(f"ssm must be float32, got {ssm.dtype}")
    if tuple(ssm.shape[1:]) != (num_heads, head_dim, state_size):
        raise ValueError(f"ssm must be [S, {num_heads}, {head_dim}, {state_size}], got {tuple(ssm.shape)}")


class Dims(NamedTuple):
    """Head sizes of one call: H heads of P channels, G groups of N state entries, R = H // G heads a group."""

    heads: int
    head_dim: int
    groups: int
    dstate: int
    reps: int


def check_dims(x: Tensor, B: Tensor, ssm: Tensor) -> Dims:
    """Sizes from x [..., H, P] and B [..., G, N], after checking ssm (see `check_state`)."""
    heads, head_dim = x.shape[-2:]
    groups, dstate = B.shape[-2:]
    check_state(ssm, heads, head_dim, dstate)
    return Dims(heads, head_dim, groups, dstate, heads // groups)


def check_steps(steps: int, hist: int) -> None:
    """A verify step of T tokens must fit in the replay history (T <= HIST)."""
    if steps > hist:
        raise ValueError(f"T={steps} exceeds the replay history length {hist}")


def add_skip(y: Tensor, x: Tensor, D: Tensor | None) -> Tensor:
    """y + D x, D [H] per head (y unchanged when D is None). y: [..., H, P] fp32; x: [..., H, P]."""
    if D is None:
        return y
    return y + D.float()[:, None] * x.float()


def causal_decay(cum: Tensor) -> Tensor:
    """exp(cum_t - cum_s) for s <= t and 0 above. cum: [..., T] running sums -> [..., T(t), T(s)].

    Masked to -inf before exp so that the upper triangle (positive exponents) never overflows."""
    steps = cum.shape[-1]
    causal = torch.ones(steps, steps, dtype=torch.bool, device=cum.device).tril()
    return torch.exp(torch.where(causal, cum[..., :, None] - cum[..., None, :], -torch.inf))
