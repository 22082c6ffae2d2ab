"""`tl.dot` as the kernels use it: fp32 accumulation, right in Triton's CPU interpreter too."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def dot(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b in fp32; UPCAST: the operands as fp32 first (the CPU interpreter's 16-bit dot is wrong:
    it multiplies the bit patterns; fp32 products of 16-bit values are exact, as the tensor cores' are)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=PRECISION)


def dot_args(x: torch.Tensor) -> dict[str, object]:
    """`dot`'s PRECISION and UPCAST for operands like x: "ieee" keeps fp32 fp32 (tf32 only names the default
    for 16-bit operands); UPCAST off CUDA (the interpreter)."""
    return dict(PRECISION="ieee" if x.dtype == torch.float32 else "tf32", UPCAST=x.device.type != "cuda")
