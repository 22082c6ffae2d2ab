"""The replay bookkeeping after a verify step, shared by Mamba2 and GDN (docs/layouts.md), no host sync.

This is the one home of the PNAT / buffer-flip rule: the ops export it as `mamba2_accept` and
`gdn_accept`, and `states.replay.ReplayState.on_accept` calls it on the pool's bookkeeping roles.
"""
import torch

from .slot_io import RowScatter
from .triton_support import runs_triton


def replay_accept(
    pnat: torch.Tensor, buf_idx: torch.Tensor, slots: torch.Tensor, num_tokens: int | torch.Tensor,
    num_valid: torch.Tensor, hist: int,
) -> None:
    """pnat, buf_idx [S] int32 (a bookkeeping role's `role[0]`, updated in place); slots [B] (negative:
    padding, writes nothing); num_tokens T, one for the batch or [B] per row; num_valid [B] valid tokens
    of the step (1..T); hist = HIST.

    Per row with p = pnat[slot]: if p + T > HIST (the step folded) flip buf_idx and set pnat = v, else
    pnat = p + v."""
    if runs_triton(pnat) and pnat.is_contiguous() and buf_idx.is_contiguous():
        from .replay_accept_triton import replay_accept_triton

        return replay_accept_triton(pnat, buf_idx, slots, num_tokens, num_valid, hist)
    sc = slots.clamp_min(0)
    p, b = pnat[sc], buf_idx[sc]
    folded = p + num_tokens > hist
    v = num_valid.to(p.device, p.dtype)
    scatter = RowScatter((slots,), slots >= 0)
    scatter.put(pnat, torch.where(folded, v, p + v))
    scatter.put(buf_idx, torch.where(folded, 1 - b, b))
