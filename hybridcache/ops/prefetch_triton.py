"""Cache-line prefetches from a Triton kernel: PTX `prefetch.global.L1` / `.L2` on a tensor of pointers, one per
lane, no result and no register held afterwards. A kernel that walks tokens one by one, loading each token's
small vectors just before its passes over a state tile, waits one memory round trip a token; prefetching every
token's lines at entry turns those into one round trip beside the tile's own load.

The interpreter has no inline assembly: `prefetch_level(level)` is NONE there, and a kernel takes it as a
constexpr. A prefetch is a hint: the pointers given stay inside their tensors (`row_lines` clamps them).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .triton_support import interpreting

NONE, L1, L2 = 0, 1, 2


def prefetch_level(level: int) -> int:
    """`level` where kernels compile (a launch on CUDA, a compile for sm_90 from the CPU), NONE in the interpreter."""
    return NONE if interpreting() else level


@triton.jit
def prefetch(ptrs, LEVEL: tl.constexpr):
    """Start loading the cache lines at `ptrs` (any shape) into L1 (LEVEL 1) or L2 (LEVEL 2); nothing at 0."""
    if LEVEL == 1:
        tl.inline_asm_elementwise("prefetch.global.L1 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)
    elif LEVEL == 2:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def row_lines(base, first, width, s_col, BLOCK: tl.constexpr, STEP: tl.constexpr):
    """Pointers [BLOCK // STEP] into the row at `base` (column stride s_col): every STEP-th of columns [first,
    first + BLOCK), clamped to below `width`; with STEP elements at most 128 bytes, every line they touch."""
    return base + tl.minimum(first + tl.arange(0, BLOCK // STEP) * STEP, width - 1) * s_col
