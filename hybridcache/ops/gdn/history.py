"""Reading a row's valid replay history (buffer `buf_idx`, tokens `[0, pnat)`) and folding it into a state."""
from typing import NamedTuple

import torch

from .block import per_value_head


class History(NamedTuple):
    """p, b [B] int64 (p = 0 for padding rows); keys [B, H, HIST, K] fp32; uw [B, HV, HIST, V] fp32, the
    history's u weighted by exp(G_last − G_j); G_last [B, HV] (0 when p = 0). Entries past p are zero."""

    p: torch.Tensor
    b: torch.Tensor
    keys: torch.Tensor
    uw: torch.Tensor
    G_last: torch.Tensor


def read_history(
    replay_u: torch.Tensor,
    replay_k: torch.Tensor,
    replay_G: torch.Tensor,
    pnat: torch.Tensor,
    buf_idx: torch.Tensor,
    slots: torch.Tensor,
) -> History:
    """replay_u [S, 2, HIST, HV, V], replay_k [S, 2, HIST, H, K], replay_G [S, 2, HV, HIST], pnat, buf_idx [S].

    No host sync: every row gathers its own buffer and masks past its p (a `where`, so stale NaNs never leak).
    """
    sc = slots.clamp(min=0)
    p = torch.where(slots >= 0, pnat.index_select(0, sc), 0).long()
    b = buf_idx.index_select(0, sc).long()
    rb = sc * 2 + b  # row of the [S·2, ...] view
    hist = replay_u.shape[2]
    m = (torch.arange(hist, device=p.device) < p[:, None])[..., None, None]  # [B, HIST, 1, 1]
    G = replay_G.flatten(0, 1).index_select(0, rb)  # [B, HV, HIST]
    last = (p - 1).clamp(min=0)[:, None, None].expand(-1, G.shape[1], 1)
    G_last = torch.where(p[:, None] > 0, G.gather(-1, last).squeeze(-1), 0.0)
    # weight exp(G_last − G_j) is finite for j < p and masked with u past p
    weight = (G_last[..., None] - G).exp().transpose(1, 2)[..., None]  # [B, HIST, HV, 1]
    uw = torch.where(m, replay_u.flatten(0, 1).index_select(0, rb) * weight, 0.0).transpose(1, 2)
    keys = torch.where(m, replay_k.flatten(0, 1).index_select(0, rb).float(), 0.0).transpose(1, 2)
    return History(p, b, keys, uw, G_last)


def fold(h: torch.Tensor, hist: History) -> torch.Tensor:
    """In place: checkpoint h [B, HV, K, V] fp32 -> effective state `exp(G_last)·h + Σ_{j<p} k_j·uw_jᵀ`.
    Returns h."""
    hv = h.shape[1]
    h.mul_(hist.G_last.exp()[..., None, None])
    h.flatten(0, 1).baddbmm_(per_value_head(hist.keys, hv).transpose(-1, -2), hist.uw.flatten(0, 1))
    return h
