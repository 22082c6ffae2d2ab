"""Cache-line prefetches from a Triton kernel: PTX `prefetch.global.L2` on a tensor of pointers, one a lane; no
result and no register held afterwards: a hint, which changes no value.

The interpreter has no inline assembly: `prefetch_level(on)` is NONE there, and a kernel takes the level as a
constexpr.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .triton_support import interpreting

NONE, L2 = 0, 2


def prefetch_level(on: bool) -> int:
    """L2 where asked and kernels compile (a launch on CUDA, a compile for sm_90 from the CPU), NONE in the
    interpreter or where not asked."""
    return L2 if on and not interpreting() else NONE


@triton.jit
def prefetch_l2(ptrs, LEVEL: tl.constexpr):
    """Start loading the cache lines at `ptrs` (any shape) into L2 where LEVEL is L2; nothing at NONE."""
    if LEVEL == 2:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)
