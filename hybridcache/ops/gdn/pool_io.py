"""Reading and writing one layer's role slice `[S, ...]` through a slot index `slots [B]`.

Negative slots are padding rows: they read zeros and write nothing. Reads never synchronise with the
host; a write selects its rows with one `nonzero` (a single host sync per call, on the slot mask).
The KDA op reuses these helpers.
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


def select_buffer(role: torch.Tensor, slots: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """role [S, 2, ...], slots [B] (clamped, >= 0), buf [B] in {0, 1} -> role[slots, buf] [B, ...]."""
    return role.flatten(0, 1).index_select(0, slots * 2 + buf)


def live_rows(mask: torch.Tensor) -> torch.Tensor:
    """mask [B] bool -> int64 row indices where it is true (the one host sync of a write)."""
    return mask.nonzero().squeeze(1)


def write_rows(pool: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, rows: torch.Tensor) -> None:
    """pool[slots[rows]] = values[rows], cast to the pool dtype. rows: from `live_rows`."""
    pool.index_copy_(0, slots.index_select(0, rows), values.index_select(0, rows).to(pool.dtype))


def put_tokens(role: torch.Tensor, at: torch.Tensor, values: torch.Tensor) -> None:
    """role [S, 2, HIST, ...] contiguous; at [R, T] flat (slot·2 + buffer)·HIST + position;
    values [R, T, ...]. One flat `index_copy_` (far cheaper on CPU than a multi-index `index_put_`)."""
    flat = role.view(-1, *role.shape[3:])
    flat.index_copy_(0, at.flatten(), values.flatten(0, 1).to(role.dtype))


def put_last(role: torch.Tensor, at: torch.Tensor, values: torch.Tensor) -> None:
    """role [S, 2, X, HIST] contiguous (position last); at as in `put_tokens`; values [R, X, T]."""
    hist, x = role.shape[-1], role.shape[-2]
    row, pos = at // hist, at % hist  # row = slot·2 + buffer
    idx = (row[:, None, :] * x + torch.arange(x, device=at.device)[None, :, None]) * hist + pos[:, None, :]
    role.view(-1).index_copy_(0, idx.flatten(), values.flatten().to(role.dtype))
