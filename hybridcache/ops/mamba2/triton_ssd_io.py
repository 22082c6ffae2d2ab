"""Mamba2 prefill on fla's simple-GLA kernel (`prefill.mamba2_prefill_fla`): its inputs and its output,
each as one Triton pass instead of a dozen torch ones.

`ssd_inputs_triton` reads x [N, H, P], raw dt [N, H], B and C [N, G, Ns] once and writes what the kernel
takes: q = C and k = B of each head's group (head h reads group h // (H / G)), v = dt·x and the log-gate
g = dt·A, with dt processed in the kernel (softplus of dt + bias, clamped to the limits), all in fp32
before the stores round q, k and v to x's dtype. `ssd_output_triton` adds the skip: y = o + D·x, fp32
inside, stored in x's dtype.

One program takes BLOCK_T tokens of one head; the G groups' B and C rows are read by the H / G programs of
their heads, which L2 serves after the first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridcache.ops.mamba2.common import NO_LIMIT, DtLimit
from hybridcache.ops.mamba2.triton_verify import softplus
from hybridcache.ops.pdl_triton import pdl_entry, pdl_launch

BLOCK_T = 32


@triton.jit
def _inputs_kernel(
    x_ptr, dt_ptr, A_ptr, bias_ptr, B_ptr, C_ptr, q_ptr, k_ptr, v_ptr, g_ptr,
    dt_lo, dt_hi, num_tokens, heads, head_dim, dstate, heads_per_group,
    sx_t, sx_h, sd_t, sd_h, sB_t, sB_g, sC_t, sC_g,
    BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    tblock, head = tl.program_id(0), tl.program_id(1)
    group = head // heads_per_group
    t = (tblock * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    p, n = tl.arange(0, BLOCK_P), tl.arange(0, BLOCK_N)
    t_ok = t < num_tokens
    x_ok = t_ok[:, None] & (p < head_dim)[None, :]
    n_ok = t_ok[:, None] & (n < dstate)[None, :]

    dt = tl.load(dt_ptr + t * sd_t + head * sd_h, mask=t_ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        dt += tl.load(bias_ptr + head).to(tl.float32)
    dt = tl.minimum(tl.maximum(softplus(dt), dt_lo), dt_hi)
    tl.store(g_ptr + t * heads + head, dt * tl.load(A_ptr + head).to(tl.float32), mask=t_ok)

    x = tl.load(x_ptr + t[:, None] * sx_t + head * sx_h + p[None, :], mask=x_ok, other=0.0).to(tl.float32)
    out_x = (t[:, None] * heads + head) * head_dim + p[None, :]  # v is [N, H, P] contiguous
    tl.store(v_ptr + out_x, (x * dt[:, None]).to(v_ptr.dtype.element_ty), mask=x_ok)

    out_n = (t[:, None] * heads + head) * dstate + n[None, :]  # q, k are [N, H, Ns] contiguous
    b = tl.load(B_ptr + t[:, None] * sB_t + group * sB_g + n[None, :], mask=n_ok, other=0.0)
    tl.store(k_ptr + out_n, b.to(k_ptr.dtype.element_ty), mask=n_ok)
    c = tl.load(C_ptr + t[:, None] * sC_t + group * sC_g + n[None, :], mask=n_ok, other=0.0)
    tl.store(q_ptr + out_n, c.to(q_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _output_kernel(
    o_ptr, x_ptr, D_ptr, y_ptr, num_tokens, heads, head_dim, so_t, so_h, sx_t, sx_h,
    BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    tblock, head = tl.program_id(0), tl.program_id(1)
    t = (tblock * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    p = tl.arange(0, BLOCK_P)
    ok = (t < num_tokens)[:, None] & (p < head_dim)[None, :]
    o = tl.load(o_ptr + t[:, None] * so_t + head * so_h + p[None, :], mask=ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + t[:, None] * sx_t + head * sx_h + p[None, :], mask=ok, other=0.0).to(tl.float32)
    y = o + tl.load(D_ptr + head).to(tl.float32) * x
    tl.store(y_ptr + (t[:, None] * heads + head) * head_dim + p[None, :], y.to(y_ptr.dtype.element_ty), mask=ok)


def _unit_last(*ts: Tensor) -> None:
    for t in ts:
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"the last dim must be unit-stride, got strides {t.stride()}")


def ssd_inputs_triton(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, dt_bias: Tensor | None,
                      dt_limit: DtLimit = NO_LIMIT) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """fla's simple-GLA inputs for a Mamba2 prefill, in one launch.

    x: [N, H, P]; dt: [N, H] raw; A, dt_bias: [H]; B, C: [N, G, Ns] (last dims unit-stride).
    Returns q = C and k = B per head [N, H, Ns], v = dt·x [N, H, P] (all three in x's dtype) and
    g = dt·A [N, H] fp32, dt = clamp(softplus(dt + dt_bias), *dt_limit).
    """
    num_tokens, heads, head_dim = x.shape
    groups, dstate = B.shape[1:]
    if heads % groups:
        raise ValueError(f"num_heads {heads} is not a multiple of ngroups {groups}")
    _unit_last(x, B, C)
    q = torch.empty(num_tokens, heads, dstate, dtype=x.dtype, device=x.device)
    k, v = torch.empty_like(q), torch.empty(num_tokens, heads, head_dim, dtype=x.dtype, device=x.device)
    g = torch.empty(num_tokens, heads, dtype=torch.float32, device=x.device)
    if num_tokens == 0 or heads == 0:
        return q, k, v, g
    A = A.contiguous()
    bias = dt_bias.contiguous() if dt_bias is not None else A  # unused when absent
    _inputs_kernel[(triton.cdiv(num_tokens, BLOCK_T), heads)](
        x, dt, A, bias, B, C, q, k, v, g, float(dt_limit[0]), float(dt_limit[1]),
        num_tokens, heads, head_dim, dstate, heads // groups,
        x.stride(0), x.stride(1), dt.stride(0), dt.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        BLOCK_T=BLOCK_T, BLOCK_P=triton.next_power_of_2(head_dim), BLOCK_N=triton.next_power_of_2(dstate),
        HAS_BIAS=dt_bias is not None, num_warps=4, **pdl_launch(x),
    )
    return q, k, v, g


def ssd_output_triton(o: Tensor, x: Tensor, D: Tensor) -> Tensor:
    """y = o + D·x per head in one launch. o, x: [N, H, P] (last dims unit-stride); D: [H].
    Returns y [N, H, P] in x's dtype (the sum in fp32)."""
    num_tokens, heads, head_dim = x.shape
    _unit_last(o, x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_tokens == 0 or heads == 0:
        return y
    _output_kernel[(triton.cdiv(num_tokens, BLOCK_T), heads)](
        o, x, D.contiguous(), y, num_tokens, heads, head_dim, o.stride(0), o.stride(1), x.stride(0), x.stride(1),
        BLOCK_T=BLOCK_T, BLOCK_P=triton.next_power_of_2(head_dim), num_warps=4, **pdl_launch(o),
    )
    return y
