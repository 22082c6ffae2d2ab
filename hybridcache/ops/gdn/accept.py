"""Acceptance bookkeeping for the GDN replay history, run once per step after all layers (no host sync)."""
import torch

from ..slot_io import RowScatter
from .pool_io import gather_rows


def gdn_accept(
    pnat: torch.Tensor,
    buf_idx: torch.Tensor,
    slots: torch.Tensor,
    T: int,
    num_valid: torch.Tensor,
    hist: int,
) -> None:
    """pnat, buf_idx [S] int32 (updated in place); slots [B]; num_valid [B] valid tokens of the step (>= 1);
    hist = HIST. Per live row with p = pnat[slot]: if p + T > hist (the step folded) flip buf_idx and set
    pnat = v, else pnat = p + v."""
    p, b = gather_rows(pnat, slots), gather_rows(buf_idx, slots)
    folded = p + T > hist
    nv = num_valid.to(p.device, p.dtype)
    scatter = RowScatter((slots,), slots >= 0)
    scatter.put(pnat, torch.where(folded, nv, p + nv))
    scatter.put(buf_idx, torch.where(folded, 1 - b, b))
