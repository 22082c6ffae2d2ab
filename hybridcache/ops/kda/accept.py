"""Acceptance bookkeeping for the KDA pending-draft caches, run once per step after all layers (no host sync).

The one home of the rule: `states.kda.KDAState.on_accept` calls it on the pool's `pend_n` role.
"""
import torch

from ..slot_io import put_rows


def kda_accept(pend_n: torch.Tensor, slots: torch.Tensor, num_valid: torch.Tensor) -> None:
    """pend_n [S] int32 (in place); slots [B]; num_valid [B] (>= 1): pend_n[slot] = v - 1 for live rows.

    The verify step wrote the state after token 0 to ssm and tokens 1..T-1 to pend_*; the v - 1 accepted
    drafts among them are the ones still pending."""
    put_rows(pend_n, (slots,), num_valid.to(pend_n.device) - 1, slots >= 0)
