"""Reading one layer's role slice `[S, ...]` through a slot index `slots [B]`; writes go through
`hybridcache.ops.slot_io` (`put_rows`, `RowScatter`).

Negative slots are padding rows: they read zeros and write nothing. Nothing here synchronises with the
host. The KDA op reuses these helpers.
"""
import torch


def read_rows(
    pool: torch.Tensor, slots: torch.Tensor, has_initial: torch.Tensor | None = None
) -> torch.Tensor:
    """pool [S, ...], slots [B] int64, has_initial [B] bool -> [B, ...] fp32 copy.

    Rows that are padding or have `has_initial` false read zeros (a `where`, so stale NaNs never leak).
    """
    keep = slots >= 0
    if has_initial is not None:
        keep = keep & has_initial.to(keep.device)
    rows = pool.index_select(0, slots.clamp(min=0)).float()
    return torch.where(keep.view(-1, *([1] * (rows.dim() - 1))), rows, 0.0)


def gather_rows(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Like `read_rows` but keeps the pool dtype (for int bookkeeping and history roles)."""
    rows = pool.index_select(0, slots.clamp(min=0))
    keep = (slots >= 0).view(-1, *([1] * (rows.dim() - 1)))
    return torch.where(keep, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
