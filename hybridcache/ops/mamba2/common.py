"""Small pieces every Mamba2 path shares: dt processing and group-to-head expansion."""

from __future__ import annotations

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
