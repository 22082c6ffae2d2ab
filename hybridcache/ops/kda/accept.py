"""Acceptance bookkeeping for the KDA pending-draft caches, run once per step after all layers."""
import torch

from ..gdn.pool_io import live_rows


def kda_accept(pend_n: torch.Tensor, slots: torch.Tensor, num_valid: torch.Tensor) -> None:
    """pend_n [S] int32 (in place); slots [B]; num_valid [B] (>= 1): pend_n[slot] = v - 1 for live rows."""
    rows = live_rows(slots >= 0)
    pend_n[slots[rows]] = (num_valid.to(pend_n.device)[rows] - 1).to(pend_n.dtype)
