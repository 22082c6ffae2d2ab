"""Weights streamed into L2 ahead of the launch that reads them, as one small launch: each thread issues one bulk
prefetch (`cp.async.bulk.prefetch.L2`, sm_90: the copy engine fetches the bytes, no registers or loads held) of
a CHUNK-byte piece, and the launch ends at once while DRAM streams them. Issued before a few small dependent
kernels (a norm, a conv update, a recurrent decode: launches that leave DRAM idle), the weight-streaming launch
after them then reads L2 instead of DRAM. A hint only: nothing is written and no value depends on it.

Under PDL the prefetches are issued before the wait (weights are parameters no kernel of the step writes), so
they start while the launch before still runs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl_triton import _capability, pdl_entry, pdl_launch

CHUNK = 1 << 11  # bytes a thread's one bulk prefetch asks for (a multiple of 16)
NUM_WARPS = 1


@triton.jit
def _prefetch_l2(base, nbytes, pid, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """Bulk L2 prefetches of bytes [pid·LANES·CHUNK, (pid + 1)·LANES·CHUNK) of `base` (int8 pointer), one
    chunk a lane, clipped to nbytes (a multiple of 16)."""
    start = (pid * LANES + tl.arange(0, LANES)).to(tl.int64) * CHUNK
    size = tl.minimum(nbytes - start, CHUNK)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [base + start, size.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_kernel(base, nbytes, PDL: tl.constexpr, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """Program pid asks for bytes [pid·LANES·CHUNK, (pid + 1)·LANES·CHUNK) of base's nbytes."""
    _prefetch_l2(base, nbytes, tl.program_id(0), CHUNK, LANES)
    pdl_entry(PDL)


def supported(t: torch.Tensor) -> bool:
    """Whether `l2_prefetch` issues anything for t: contiguous, 16-byte aligned, on CUDA of compute capability 9.0
    or more."""
    return t.is_cuda and t.is_contiguous() and t.data_ptr() % 16 == 0 and _capability(t.device.index or 0) >= 9


def l2_prefetch(weight: torch.Tensor) -> None:
    """Ask L2 for the bytes of `weight` (`supported`; its bytes rounded down to 16, a bulk prefetch's unit); one
    launch, which returns at once."""
    lanes = NUM_WARPS * 32
    nbytes = weight.numel() * weight.element_size() // 16 * 16
    if nbytes == 0:
        return
    _l2_prefetch_kernel[(triton.cdiv(nbytes, lanes * CHUNK),)](weight.view(-1).view(torch.int8), nbytes, CHUNK=CHUNK,
                                                               LANES=lanes, num_warps=NUM_WARPS, **pdl_launch(weight))
