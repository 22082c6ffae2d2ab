"""The four RMSNorms of `models/layers/norm.py` as one fused Triton kernel: one launch per norm call where the
torch forwards take 7-10 small kernels (the per-kernel cost dominates a batch-1 decode step).

Each mode reproduces its torch forward's rounding points in the same order; all math is fp32 and
`rnd_T(v)` rounds to dtype T (nearest, ties to even) where torch casts between steps. With
r = rsqrt(mean(h²) + eps) over one row of D channels:

  PLAIN    (RMSNorm)              out = rnd_x((x·r)·s)                       s = w, or 1 + w when zero-centred
           with ADD (`RMSNorm.add`): x = rnd_x(x + d) first, stored as the sum (the residual stream), then as above
  GROUP    (GatedGroupRMSNorm)    h = y·silu(z);  out = rnd_out(w·rnd_y(h·r))  out = promote(w, y); a row is one
                                                                              group, w is that group's slice
  SILU     (GatedRMSNorm)         out = rnd_y(rnd_mid(w·rnd_y(y·r))·silu(z))   mid = promote(w, y)
  SIGMOID  (SigmoidGatedRMSNorm)  out = rnd_o((w·(o·r))·sigmoid(gate))

A 16-bit product of two 16-bit values (torch's bf16 x bf16) is the fp32 product rounded once, which is what
`rnd` of the fp32 product gives. Rows: the input as [M, G, D] with strides (sm, sg, 1), so a column slice
of a wider tensor (`in_proj(...).split(...)`, heads of it viewed [N, H, V]) is read in place; an input
with no unit last stride, or whose leading dims do not fold into [M, G], is copied first. Row r = m·G + g;
the output is contiguous in the input's shape. ROWS rows a program, the [ROWS, BLOCK_D] tile in registers.
No host sync: an output allocation and one launch (CUDA-graph capturable).

Against torch in fp32: the divisions (mean, silu, sigmoid) round to nearest as torch's do; the sum of squares
runs in another order, and rsqrt and exp are Triton's (approximate to an ulp or two), so fp32 results agree
to a few 1e-7 relative and a 16-bit result flips its last bit where that lands on a rounding boundary.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .pdl_triton import pdl_entry, pdl_launch

PLAIN, GROUP, SILU, SIGMOID = (tl.constexpr(mode) for mode in range(4))  # the kernel's MODE
MAX_D = 16384  # channels a row: the row's fp32 tile lives in registers (32 a thread per tensor at 16 warps)
TILE = 2048  # elements a program aims at: several short rows (head_dim 128) share one program
_TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _round(v, DTYPE: tl.constexpr):
    """fp32 `v` rounded to DTYPE (to nearest, ties to even), returned as fp32.

    bf16 by hand: Triton's CPU interpreter truncates fp32 -> bf16 casts, the GPU rounds to nearest even; the
    integer form rounds the same on both (a few integer ops, nothing against this kernel's loads). NaN kept.
    """
    if DTYPE == tl.float32:
        return v
    elif DTYPE == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return tl.where(v == v, bits.to(tl.float32, bitcast=True), v)
    else:
        return v.to(DTYPE).to(tl.float32)


@triton.jit
def _silu(v):
    """torch's fp32 silu, v / (1 + exp(-v)), dividing to nearest as torch does (`/` is approximate here)."""
    return tl.math.div_rn(v, 1.0 + tl.exp(-v))


@triton.jit
def _sigmoid(v):
    """torch's fp32 sigmoid, 1 / (1 + exp(-v))."""
    return tl.math.div_rn(1.0, 1.0 + tl.exp(-v))


@triton.jit
def _rms_norm_kernel(
    x_ptr, z_ptr, w_ptr, out_ptr, sum_ptr,
    rows, G, stride_xm, stride_xg, stride_zm, stride_zg, eps,
    D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
    MODE: tl.constexpr, ZERO_CENTRED: tl.constexpr, MID: tl.constexpr, ADD: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_D)
    m = (r // G).to(tl.int64)
    g = (r % G).to(tl.int64)
    mask = (r < rows)[:, None] & (c < D)[None, :]
    # the weight (GROUP: this row's group's slice) read first, with x: at sm_90, read after the sum of squares or
    # after the sum's store it went out only then, one more memory round trip a program
    if MODE == GROUP:
        w = tl.load(w_ptr + (g * D)[:, None] + c[None, :], mask=mask, other=0.0).to(tl.float32)
    else:
        w = tl.load(w_ptr + c, mask=c < D, other=0.0).to(tl.float32)[None, :]
    x = tl.load(x_ptr + (m * stride_xm + g * stride_xg)[:, None] + c[None, :], mask=mask, other=0.0).to(tl.float32)
    X: tl.constexpr = x_ptr.dtype.element_ty
    if MODE != PLAIN or ADD:  # a gate: z (GROUP, SILU) or gate (SIGMOID); with ADD the delta
        z = tl.load(z_ptr + (m * stride_zm + g * stride_zg)[:, None] + c[None, :], mask=mask, other=0.0)
        z = z.to(tl.float32)
    if ADD:  # the residual stream x + d, rounded as torch's add in x's dtype, kept and normalised
        x = _round(x + z, X)
        tl.store(sum_ptr + r.to(tl.int64)[:, None] * D + c[None, :], x.to(X), mask=mask)
    if MODE == GROUP:  # gate first
        x = x * _silu(z)
    n = x * tl.rsqrt(tl.math.div_rn(tl.sum(x * x, axis=1), D * 1.0) + eps)[:, None]  # mean(h²)

    if MODE == PLAIN:
        if ZERO_CENTRED:
            w = 1.0 + w
        out = n * w
    elif MODE == GROUP:
        out = w * _round(n, X)
    elif MODE == SILU:
        out = _round(w * _round(n, X), MID) * _silu(z)
    else:  # SIGMOID
        out = w * n * _sigmoid(z)
    O: tl.constexpr = out_ptr.dtype.element_ty
    tl.store(out_ptr + r.to(tl.int64)[:, None] * D + c[None, :], _round(out, O).to(O), mask=mask)


def _rows(x: Tensor) -> Tensor:
    """x [..., G, D] (at least 2-D) -> [M, G, D] with a unit last stride: a view where the strides allow."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def _launch(mode: tl.constexpr, x: Tensor, z: Tensor | None, weight: Tensor, eps: float, out_dtype: torch.dtype,
            zero_centred: bool = False, summed: Tensor | None = None) -> Tensor:
    """x, z: [..., G, D] (same shape) -> out [..., G, D] in out_dtype, contiguous. `summed` (PLAIN only): z is
    a delta added to x first, and x + z is written there (contiguous, x's shape and dtype)."""
    assert z is None or z.shape == x.shape, f"gate {tuple(z.shape)} != input {tuple(x.shape)}"
    D = x.shape[-1]
    assert D <= MAX_D, f"{D} channels a row: over the fused norm's {MAX_D}"
    assert weight.shape == ((x.shape[-2] * D,) if mode == GROUP else (D,)), f"weight {tuple(weight.shape)}"
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    x3 = _rows(x)
    z3 = x3 if z is None else _rows(z)
    M, G = x3.shape[0], x3.shape[1]
    rows = M * G
    block_d = triton.next_power_of_2(D)
    per_program = max(1, TILE // block_d)  # not fitted to `rows`: one compile per D, whatever the batch
    warps = min(16, max(1, per_program * block_d // 512))  # 16 fp32 elements a thread, up to 16 warps
    mid = torch.promote_types(weight.dtype, x.dtype)
    _rms_norm_kernel[(triton.cdiv(rows, per_program),)](
        x3, z3, weight, out, out if summed is None else summed,
        rows, G, x3.stride(0), x3.stride(1), z3.stride(0), z3.stride(1), eps,
        D=D, BLOCK_D=block_d, ROWS=per_program, MODE=mode.value, ZERO_CENTRED=zero_centred, MID=_TL_DTYPE[mid],
        ADD=summed is not None, num_warps=warps, **pdl_launch(x3),
    )
    return out


def _heads(x: Tensor) -> Tensor:
    return x if x.ndim >= 2 else x.unsqueeze(0)


def rms_norm_triton(x: Tensor, weight: Tensor, eps: float, zero_centred: bool = False) -> Tensor:
    """`RMSNorm.forward`: x [..., D], weight [D] -> [..., D] in x's dtype."""
    return _launch(PLAIN, _heads(x), None, weight, eps, x.dtype, zero_centred).view(x.shape)


def add_rms_norm_triton(x: Tensor, delta: Tensor, weight: Tensor, eps: float,
                        zero_centred: bool = False) -> tuple[Tensor, Tensor]:
    """`RMSNorm.add`: (norm(x + delta), x + delta) in one launch; x, delta [..., D] of one dtype, weight [D]."""
    assert delta.shape == x.shape and delta.dtype == x.dtype, f"delta {tuple(delta.shape)} {delta.dtype} != x"
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = _launch(PLAIN, _heads(x), _heads(delta), weight, eps, x.dtype, zero_centred, summed)
    return out.view(x.shape), summed


def gated_group_rms_norm_triton(y: Tensor, z: Tensor, weight: Tensor, groups: int, eps: float) -> Tensor:
    """`GatedGroupRMSNorm.forward`: y, z [N, I], weight [I] -> [N, I] in promote(weight, y); RMS over each of
    `groups` slices of I / groups channels."""
    split = (*y.shape[:-1], groups, y.shape[-1] // groups)
    out_dtype = torch.promote_types(weight.dtype, y.dtype)
    return _launch(GROUP, y.view(split), z.view(split), weight, eps, out_dtype).view(y.shape)


def gated_rms_norm_triton(y: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`GatedRMSNorm.forward`: y, z [..., V] (e.g. [N, HV, V]), weight [V] -> [..., V] in y's dtype."""
    return _launch(SILU, _heads(y), _heads(z), weight, eps, y.dtype).view(y.shape)


def sigmoid_gated_rms_norm_triton(o: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`SigmoidGatedRMSNorm.forward`: o, gate [..., D] (e.g. [N, H, D]), weight [D] -> [..., D] in o's dtype."""
    return _launch(SIGMOID, _heads(o), _heads(gate), weight, eps, o.dtype).view(o.shape)
