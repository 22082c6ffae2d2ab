"""Reading a row's valid replay history (buffer `buf_idx`, tokens `[0, pnat)`) as fp32 matrices."""
from typing import NamedTuple

import torch

from .pool_io import gather_rows, select_buffer


class History(NamedTuple):
    """p, b [B] int64; keys [B, HV, HIST, K]; u [B, HV, HIST, V]; G [B, HV, HIST]; G_last [B, HV];
    weight [B, HV, HIST] = exp(G_last − G_j) for j < p, else 0. Entries past p are zero."""

    p: torch.Tensor
    b: torch.Tensor
    keys: torch.Tensor
    u: torch.Tensor
    G: torch.Tensor
    G_last: torch.Tensor
    weight: torch.Tensor


def read_history(
    replay_u: torch.Tensor,
    replay_k: torch.Tensor,
    replay_G: torch.Tensor,
    pnat: torch.Tensor,
    buf_idx: torch.Tensor,
    slots: torch.Tensor,
) -> History:
    """replay_u [S, 2, HIST, HV, V], replay_k [S, 2, HIST, H, K], replay_G [S, 2, HV, HIST], pnat, buf_idx [S].

    Padding rows read p = 0. No host sync: every row gathers its own buffer and masks past its p.
    """
    sc = slots.clamp(min=0)
    p, b = gather_rows(pnat, slots).long(), gather_rows(buf_idx, slots).long()
    hist, hv = replay_u.shape[2], replay_u.shape[3]
    m = torch.arange(hist, device=p.device) < p[:, None]
    u = torch.where(m[:, :, None, None], select_buffer(replay_u, sc, b).float(), 0.0).transpose(1, 2)
    keys = torch.where(m[:, :, None, None], select_buffer(replay_k, sc, b).float(), 0.0)
    keys = keys.repeat_interleave(hv // keys.shape[2], dim=2).transpose(1, 2)
    G = torch.where(m[:, None, :], select_buffer(replay_G, sc, b).float(), 0.0)
    last = (p - 1).clamp(min=0)[:, None, None].expand(-1, hv, 1)
    G_last = torch.where(p[:, None] > 0, G.gather(-1, last).squeeze(-1), 0.0)
    weight = torch.where(m[:, None, :], (G_last[..., None] - G).exp(), 0.0)
    return History(p, b, keys, u, G, G_last, weight)


def fold(h: torch.Tensor, hist: History) -> torch.Tensor:
    """Checkpoint h [B, HV, K, V] + valid history -> effective state [B, HV, K, V]:
    `exp(G_last)·h + Σ_{j<p} exp(G_last − G_j)·k_j·u_jᵀ`."""
    return torch.baddbmm(
        (h * hist.G_last.exp()[..., None, None]).flatten(0, 1),
        hist.keys.transpose(-1, -2).flatten(0, 1),
        (hist.u * hist.weight[..., None]).flatten(0, 1),
    ).view_as(h)
