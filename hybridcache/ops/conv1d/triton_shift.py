"""The conv window's accept rule (`fast.shift_conv_window`) as one Triton launch over every layer of a
module: per (row, layer, block of channels) the program reads the W columns the row's valid tokens leave,
`conv[l, slot, c, v - 1 : v - 1 + W]`, waits at a barrier, and writes them to `conv[l, slot, c, :W]` (a
row's columns overlap when v <= W; its reads all finish before its writes). Padding rows (slot < 0) and
rows with v = 1 (an identity) write nothing. Graph-capturable, no host sync."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..pdl_triton import pdl_entry, pdl_launch

MAX_BLOCK_C = 256


@triton.jit
def _shift_kernel(conv_ptr, slot_ptr, valid_ptr, channels,
                  stride_l, stride_s, stride_c, stride_j,
                  W: tl.constexpr, W_POW2: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    row, layer, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    v = tl.load(valid_ptr + row).to(tl.int64)
    if slot >= 0 and v > 1:
        c = block * BLOCK_C + tl.arange(0, BLOCK_C)
        j = tl.arange(0, W_POW2)
        ok = (c[:, None] < channels) & (j[None, :] < W)
        base = conv_ptr + layer.to(tl.int64) * stride_l + slot * stride_s + c[:, None].to(tl.int64) * stride_c
        cols = tl.load(base + (v - 1 + j[None, :]) * stride_j, mask=ok)
        tl.debug_barrier()
        tl.store(base + j[None, :] * stride_j, cols, mask=ok)


def shift_conv_window_triton(conv: torch.Tensor, slots: torch.Tensor, num_valid: torch.Tensor, width: int) -> None:
    """`fast.shift_conv_window` with the same arguments: conv [L, S, C, W + k] (any strides), slots [n]
    (negative: padding), num_valid [n] in 1..T; written in place."""
    rows = slots.shape[0]
    if rows == 0 or width == 0 or conv.shape[-1] == width:
        return
    layers, _, channels, _ = conv.shape
    block = min(MAX_BLOCK_C, triton.next_power_of_2(channels))
    grid = (rows, layers, triton.cdiv(channels, block))
    _shift_kernel[grid](conv, slots, num_valid.to(slots.device), channels, *conv.stride(),
                        W=width, W_POW2=triton.next_power_of_2(width), BLOCK_C=block, **pdl_launch(conv))
