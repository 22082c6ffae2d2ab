"""Elementwise MLP glue in one launch each, equal to torch's ops on the same inputs:

- relu(x)² (torch spends two: relu, then square), nemotron_h's MLP;
- silu(gate) * up on the halves of one fused gate/up GEMM output (torch: silu, then the product);
- base + sigmoid(g) * x, g one logit a row (torch: sigmoid, product, sum), qwen3_next's shared expert;
- x * sigmoid(gate), gate [N, H, D] read through its strides (torch: sigmoid, product), qwen3_next's gated
  attention output.

Each intermediate is rounded to the tensors' dtype where torch rounds it (`_round`, to nearest even on the
GPU and in the interpreter alike), with torch's fp32 silu and sigmoid, so the results match torch's ops for
the same inputs. No host sync.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl_triton import pdl_entry, pdl_launch
from .rms_norm_triton import _round, _sigmoid, _silu

BLOCK = 2048


@triton.jit
def _relu2_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = at < n
    v = tl.maximum(tl.load(x_ptr + at, mask=inside, other=0.0).to(tl.float32), 0.0)
    out = _round(v * v, y_ptr.dtype.element_ty)
    tl.store(y_ptr + at, out.to(y_ptr.dtype.element_ty), mask=inside)


def relu2_triton(x: torch.Tensor) -> torch.Tensor:
    """`torch.square(F.relu(x))` for a contiguous x of any shape; returns a new tensor of x's dtype."""
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _relu2_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK, **pdl_launch(x))
    return y


@triton.jit
def _silu_mul_kernel(h_ptr, y_ptr, inner, stride_h, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    row = tl.program_id(0).to(tl.int64)
    at = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = at < inner
    DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    gate = tl.load(h_ptr + row * stride_h + at, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + row * stride_h + inner + at, mask=inside, other=0.0).to(tl.float32)
    out = _round(_round(_silu(gate), DTYPE) * up, DTYPE)
    tl.store(y_ptr + row * inner + at, out.to(DTYPE), mask=inside)


def silu_mul_triton(h: torch.Tensor, inner: int) -> torch.Tensor:
    """`F.silu(h[:, :inner]) * h[:, inner:2 * inner]` for h [N, >= 2 * inner] with a unit last stride (a fused
    gate/up GEMM's output; columns past 2 * inner are not read); returns [N, inner] in h's dtype."""
    assert h.dim() == 2 and h.stride(1) == 1 and h.shape[1] >= 2 * inner, "h [N, >= 2 * inner], unit last stride"
    y = torch.empty(h.shape[0], inner, dtype=h.dtype, device=h.device)
    if y.numel():
        _silu_mul_kernel[(h.shape[0], triton.cdiv(inner, BLOCK))](h, y, inner, h.stride(0), BLOCK=BLOCK,
                                                                  **pdl_launch(h))
    return y


@triton.jit
def _sigmoid_gated_add_kernel(base_ptr, x_ptr, g_ptr, y_ptr, width, stride_g, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    row = tl.program_id(0).to(tl.int64)
    at = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = at < width
    DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    gate = _round(_sigmoid(tl.load(g_ptr + row * stride_g).to(tl.float32)), DTYPE)
    x = tl.load(x_ptr + row * width + at, mask=inside, other=0.0).to(tl.float32)
    base = tl.load(base_ptr + row * width + at, mask=inside, other=0.0).to(tl.float32)
    out = _round(base + _round(gate * x, DTYPE), DTYPE)
    tl.store(y_ptr + row * width + at, out.to(DTYPE), mask=inside)


def sigmoid_gated_add_triton(base: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """`base + torch.sigmoid(g) * x` for base, x [N, D] contiguous of one dtype and g [N, 1] of it (any row
    stride); returns a new [N, D]."""
    assert base.shape == x.shape and base.is_contiguous() and x.is_contiguous() and base.dtype == x.dtype == g.dtype
    assert g.shape == (x.shape[0], 1), "g: one logit a row"
    y = torch.empty_like(x)
    if y.numel():
        _sigmoid_gated_add_kernel[(x.shape[0], triton.cdiv(x.shape[1], BLOCK))](base, x, g, y, x.shape[1],
                                                                                g.stride(0), BLOCK=BLOCK,
                                                                                **pdl_launch(base))
    return y


@triton.jit
def _sigmoid_mul_kernel(x_ptr, g_ptr, y_ptr, width, D, stride_gn, stride_gh, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    row = tl.program_id(0).to(tl.int64)
    at = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = at < width
    DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    gate = tl.load(g_ptr + row * stride_gn + (at // D) * stride_gh + at % D, mask=inside, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * width + at, mask=inside, other=0.0).to(tl.float32)
    out = _round(x * _round(_sigmoid(gate), DTYPE), DTYPE)
    tl.store(y_ptr + row * width + at, out.to(DTYPE), mask=inside)


def sigmoid_mul_triton(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`x * torch.sigmoid(gate).view(N, -1)` for x [N, H*D] contiguous and gate [N, H, D] of x's dtype with a
    unit last stride (a column slice of a GEMM's output); returns a new [N, H*D]."""
    N, H, D = gate.shape
    assert x.shape == (N, H * D) and x.is_contiguous() and gate.stride(2) == 1 and gate.dtype == x.dtype
    y = torch.empty_like(x)
    if y.numel():
        _sigmoid_mul_kernel[(N, triton.cdiv(H * D, BLOCK))](x, gate, y, H * D, D, gate.stride(0), gate.stride(1),
                                                           BLOCK=BLOCK, **pdl_launch(x))
    return y
