"""Packing a flat variable-length batch `[N, ...]` + `cu_seqlens [B+1]` into padded rows `[B, Lpad, ...]`."""
import torch


def pack_index(cu_seqlens: torch.Tensor, multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cu_seqlens [B+1] -> (gather [B, Lpad] int64 token index, -1 past a row's end;
    scatter [N] int64 position of each flat token in the flattened [B * Lpad] padded layout).

    Lpad is the longest row rounded up to `multiple` (at least `multiple`). One host read of the lengths.
    """
    cu = cu_seqlens.to(torch.int64)
    lens = cu[1:] - cu[:-1]
    longest = int(lens.max()) if lens.numel() else 0
    lpad = max(1, -(-longest // multiple)) * multiple
    t = torch.arange(lpad, device=cu.device)
    gather = torch.where(t < lens[:, None], cu[:-1, None] + t, -1)
    rows = torch.repeat_interleave(torch.arange(lens.numel(), device=cu.device), lens)
    offsets = torch.arange(int(cu[-1]), device=cu.device) - cu[:-1][rows]
    return gather, rows * lpad + offsets


def pack(x: torch.Tensor, gather: torch.Tensor) -> torch.Tensor:
    """x [N, ...] -> [B, Lpad, ...]; padding positions are zero."""
    out = x[gather.clamp(min=0)]
    keep = (gather >= 0).view(*gather.shape, *([1] * (x.dim() - 1)))
    return torch.where(keep, out, torch.zeros((), dtype=x.dtype, device=x.device))
