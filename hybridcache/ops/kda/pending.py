"""Reading a row's accepted pending drafts (`pend_*[:pend_n]`) as an identity-padded token block."""
from typing import NamedTuple

import torch

from ..slot_io import take_rows


class Pending(NamedTuple):
    """k, g [B, H, P, K]; v [B, H, P, V]; beta [B, H, P] fp32, P = draft capacity. Drafts past pend_n are
    zeroed (g = 0, beta = 0, k = 0), so they leave the state unchanged."""

    k: torch.Tensor
    g: torch.Tensor
    v: torch.Tensor
    beta: torch.Tensor


def read_pending(
    pend_k: torch.Tensor,
    pend_g: torch.Tensor,
    pend_v: torch.Tensor,
    pend_beta: torch.Tensor,
    pend_n: torch.Tensor,
    slots: torch.Tensor,
) -> Pending:
    """pend_k, pend_g [S, P, H, K]; pend_v [S, P, H, V]; pend_beta [S, P, H]; pend_n [S] int32. No host sync."""
    n = take_rows(pend_n, slots).long()
    m = torch.arange(pend_k.shape[1], device=n.device) < n[:, None]  # [B, P]
    sc = slots.clamp(min=0)

    def take(role: torch.Tensor) -> torch.Tensor:
        rows = role.index_select(0, sc).float()
        return torch.where(m.view(*m.shape, *([1] * (rows.dim() - 2))), rows, 0.0).transpose(1, 2)

    return Pending(take(pend_k), take(pend_g), take(pend_v), take(pend_beta))
