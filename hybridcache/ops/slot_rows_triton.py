"""A batch's state rows out of and back into a slot pool, one Triton launch each (prefill's slot glue).

`read_rows_triton` is `slot_io.read_rows` and `write_rows_triton` is `slot_io.put_rows(dst, (slots,), ...)`:
the torch forms need about a dozen small launches (the padding rows are pointed at a real row and then
restored, to keep shapes static), which cost more host time than a long prefill's recurrent kernels.
Here a program owns one block of one row and skips a padding row. Rows are contiguous; no host sync.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl_triton import pdl_entry, pdl_launch

BLOCK = 4096


@triton.jit
def _read_kernel(src_ptr, dst_ptr, slot_ptr, initial_ptr, row_size, HAS_INITIAL: tl.constexpr, BLOCK: tl.constexpr,
                 PDL: tl.constexpr):
    pdl_entry(PDL)
    row, block = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    keep = slot >= 0
    if HAS_INITIAL:
        keep = keep & (tl.load(initial_ptr + row) != 0)
    at = block * BLOCK + tl.arange(0, BLOCK)
    inside = at < row_size
    values = tl.load(src_ptr + slot * row_size + at, mask=inside & keep, other=0.0)
    tl.store(dst_ptr + row.to(tl.int64) * row_size + at, values.to(tl.float32), mask=inside)


@triton.jit
def _write_kernel(src_ptr, dst_ptr, slot_ptr, valid_ptr, row_size, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    row, block = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot >= 0 and tl.load(valid_ptr + row) != 0:
        at = block * BLOCK + tl.arange(0, BLOCK)
        inside = at < row_size
        values = tl.load(src_ptr + row.to(tl.int64) * row_size + at, mask=inside)
        tl.store(dst_ptr + slot * row_size + at, values.to(dst_ptr.dtype.element_ty), mask=inside)


def _row_size(pool: torch.Tensor) -> int:
    return pool[0].numel() if pool.shape[0] else 0


def read_rows_triton(src: torch.Tensor, slots: torch.Tensor, has_initial: torch.Tensor | None = None) -> torch.Tensor:
    """`slot_io.read_rows`: src [S, *R] contiguous; slots [B] (negative: padding); has_initial [B] bool or
    None. Returns [B, *R] fp32, zeros for padding rows and rows without an initial state."""
    rows, size = slots.shape[0], _row_size(src)
    out = torch.empty((rows, *src.shape[1:]), dtype=torch.float32, device=src.device)
    if rows and size:
        initial = has_initial.to(src.device) if has_initial is not None else slots
        _read_kernel[(rows, triton.cdiv(size, BLOCK))](src, out, slots, initial, size,
                                                        HAS_INITIAL=has_initial is not None, BLOCK=BLOCK,
                                                        **pdl_launch(src))
    return out


def write_rows_triton(dst: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, valid: torch.Tensor) -> None:
    """`slot_io.put_rows(dst, (slots,), values, valid)`: dst [S, *R] contiguous (written in place); values
    [B, *R] contiguous; rows with a negative slot or `valid` false write nothing. Slots must be distinct."""
    rows, size = slots.shape[0], _row_size(dst)
    if rows and size:
        _write_kernel[(rows, triton.cdiv(size, BLOCK))](values, dst, slots, valid, size, BLOCK=BLOCK,
                                                        **pdl_launch(values))


def rows_fit(pool: torch.Tensor, slots: torch.Tensor, values: torch.Tensor | None = None) -> bool:
    """Whether the one-launch kernels take these: contiguous pool (and values, of the pool's row shape)."""
    if not pool.is_contiguous() or slots.ndim != 1:
        return False
    return values is None or (values.is_contiguous() and values.shape[1:] == pool.shape[1:])
