"""Mamba2 decode (selective state update) of T tokens a row as one Triton kernel over the pool's state rows.

Two entry points share the kernel:
- `mamba2_decode_triton` (T = 1): same contract as `decode.mamba2_decode`. The kernel reads and writes
  `ssm[slot]` in place (no gather, no scatter, no host sync; `ssm` may be a strided view of a bigger pool).
- `mamba2_verify_intermediate_triton` (T tokens): same contract as `intermediate.mamba2_verify_intermediate`,
  the per-token-states approach to speculative verify (what vLLM and SGLang do): the state after each token
  t goes to `inter[slot, t]` and `ssm` is only read. `mamba2_accept_intermediate` then copies the accepted
  state back. The benchmark's fused baseline against replay verify (`triton_verify.py`).

Work split. One program takes one (row, head, block of BLOCK_P of the head's P channels): it loads its
[BLOCK_P, N] fp32 tile of `ssm[slot, head]` once, runs the row's T tokens through it one after another
(T is a compile-time constant: one compile per token count), and either stores it once at the end
(decode) or stores it after every token to `inter[slot, t]` (intermediate), writing the block's outputs
of each token. The row's dt, the head's A / D / dt_bias and the group's B and C (N values a token) are
small reads shared by the P / BLOCK_P programs of a head. A padding row (slot < 0) runs from a zero
state, as the references do, and stores no state; its state load is masked, so whatever an unused slot
holds (NaN included) never reaches an output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridcache.ops.mamba2.common import NO_LIMIT, DtLimit, check_dims
from hybridcache.ops.mamba2.triton_verify import softplus
from hybridcache.ops.pdl_triton import pdl_entry, pdl_launch
from hybridcache.ops.triton_support import num_sms

TILE = 2048  # fp32 state entries per program before the grid-filling rule shrinks BLOCK_P
MIN_BLOCK_P = 4


@triton.jit
def _decode_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, ssm_ptr, slots_ptr, D_ptr, bias_ptr, y_ptr, inter_ptr,
    dt_lo, dt_hi,
    stride_xb, stride_xt, stride_xh, stride_xp,
    stride_dtb, stride_dtt, stride_dth,
    stride_bb, stride_bt, stride_bg, stride_bn,
    stride_cb, stride_ct, stride_cg, stride_cn,
    stride_ss, stride_sh, stride_sp, stride_sn,
    stride_is, stride_it, stride_ih, stride_ip, stride_in,
    stride_yb, stride_yt, stride_yh,
    head_dim, dstate, heads_per_group,
    STEPS: tl.constexpr, INTER: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    row, head, pblock = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row64 = row.to(tl.int64)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    live = slot >= 0
    group = head // heads_per_group
    p = pblock * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    p_ok, n_ok = p < head_dim, n < dstate
    in_tile = p_ok[:, None] & n_ok[None, :]

    a = tl.load(A_ptr + head).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + head).to(tl.float32)
    if HAS_D:
        skip = tl.load(D_ptr + head).to(tl.float32)

    slot0 = tl.maximum(slot, 0)
    tile = ssm_ptr + slot0 * stride_ss + head * stride_sh + p[:, None] * stride_sp + n[None, :] * stride_sn
    if INTER:
        inter_tile = inter_ptr + slot0 * stride_is + head * stride_ih + p[:, None] * stride_ip + n[None, :] * stride_in
    # The tokens one after another (unrolled). Addresses are formed at each use and the state is loaded after
    # the first token's small loads, as the single-token kernel did: the T = 1 case then keeps its register
    # count (ptxas, sm_90, BLOCK_P = 16: 80; precomputed row pointers and an earlier state load took 94).
    for t in tl.static_range(STEPS):
        dt = tl.load(dt_ptr + row64 * stride_dtb + t * stride_dtt + head * stride_dth).to(tl.float32)
        if HAS_BIAS:
            dt += bias
        dt = tl.minimum(tl.maximum(softplus(dt), dt_lo), dt_hi)
        x = tl.load(x_ptr + row64 * stride_xb + t * stride_xt + head * stride_xh + p * stride_xp,
                    mask=p_ok, other=0.0).to(tl.float32)
        b = tl.load(B_ptr + row64 * stride_bb + t * stride_bt + group * stride_bg + n * stride_bn,
                    mask=n_ok, other=0.0).to(tl.float32)
        c = tl.load(C_ptr + row64 * stride_cb + t * stride_ct + group * stride_cg + n * stride_cn,
                    mask=n_ok, other=0.0).to(tl.float32)
        if t == 0:
            h = tl.load(tile, mask=in_tile & live, other=0.0)
        h = h * tl.exp(dt * a) + (x * dt)[:, None] * b[None, :]
        y = tl.sum(h * c[None, :], 1)
        if HAS_D:
            y += skip * x
        tl.store(y_ptr + row64 * stride_yb + t * stride_yt + head * stride_yh + p, y.to(y_ptr.dtype.element_ty),
                 mask=p_ok)
        if INTER:
            tl.store(inter_tile + t * stride_it, h.to(inter_ptr.dtype.element_ty), mask=in_tile & live)
    if not INTER:
        tl.store(tile, h, mask=in_tile & live)



def default_block_p(batch: int, heads: int, head_dim: int, dstate: int, num_sms: int) -> int:
    """Channels per program: a tile of about TILE fp32 entries, halved (not below MIN_BLOCK_P) until the
    grid has at least two programs per SM. H = 64, P = 64, N = 128 on 132 SMs: 8 at B = 1, 16 from B = 2."""
    block_p = min(triton.next_power_of_2(head_dim), max(1, TILE // triton.next_power_of_2(dstate)))
    while block_p > MIN_BLOCK_P and batch * heads * triton.cdiv(head_dim, block_p) < 2 * num_sms:
        block_p //= 2
    return block_p


def _launch(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, ssm: Tensor, slots: Tensor, D: Tensor | None,
            dt_bias: Tensor | None, dt_limit: DtLimit, y: Tensor, inter: Tensor | None, block_p: int | None) -> None:
    """One launch over x [B, T, H, P], dt [B, T, H], B, C [B, T, G, N], y [B, T, H, P] (any strides; y's
    last dim unit-stride); inter [S, >= T, H, P, N] or None (then the final state goes to ssm)."""
    batch, steps, heads, head_dim = x.shape
    dstate = B.shape[-1]
    reps = heads // B.shape[-2]
    if batch == 0 or steps == 0 or heads == 0 or head_dim == 0:
        return
    if block_p is None:
        block_p = default_block_p(batch, heads, head_dim, dstate, num_sms(x.device))
    A, slots = A.contiguous(), slots.contiguous()
    D_arg = D.contiguous() if D is not None else A  # unused when absent
    bias_arg = dt_bias.contiguous() if dt_bias is not None else A
    inter_arg = inter if inter is not None else ssm  # unused when absent
    inter_strides = inter.stride() if inter is not None else (0,) * 5
    _decode_kernel[(batch, heads, triton.cdiv(head_dim, block_p))](
        x, dt, A, B, C, ssm, slots, D_arg, bias_arg, y, inter_arg,
        float(dt_limit[0]), float(dt_limit[1]),
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *ssm.stride(), *inter_strides, *y.stride()[:3],
        head_dim, dstate, reps,
        STEPS=steps, INTER=inter is not None,
        BLOCK_P=block_p, BLOCK_N=triton.next_power_of_2(dstate), HAS_D=D is not None, HAS_BIAS=dt_bias is not None,
        num_warps=4, **pdl_launch(x),
    )


def mamba2_decode_triton(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    slots: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
    block_p: int | None = None,
) -> Tensor:
    """One Triton launch; same arguments and result as `mamba2_decode`.

    x: [B, H, P]; dt: [B, H] raw; A: [H] fp32; B, C: [B, G, N]; ssm: [S, H, P, N] fp32 (updated in place);
    slots: [B] (negative = padding: state read as zeros, nothing written); D, dt_bias: [H] or None.
    Returns y: [B, H, P] in x's dtype. `block_p` (channels per program, a power of two) defaults to
    `default_block_p`; it does not change the result.
    """
    heads, head_dim, groups, dstate, reps = check_dims(x, B, ssm)
    if heads % groups:
        raise ValueError(f"num_heads {heads} is not a multiple of ngroups {groups}")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x[:, None], dt[:, None], A, B[:, None], C[:, None], ssm, slots, D, dt_bias, dt_limit, y[:, None], None,
            block_p)
    return y


def mamba2_verify_intermediate_triton(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    inter: Tensor,
    slots: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
    block_p: int | None = None,
) -> Tensor:
    """One Triton launch; same arguments, writes and result as `mamba2_verify_intermediate`.

    x: [B, T, H, P]; dt: [B, T, H] raw; A: [H] fp32; B, C: [B, T, G, N]; ssm: [S, H, P, N] fp32 (read only);
    inter: [S, T_max, H, P, N] fp32, T_max >= T (the state after token t written to inter[slot, t] for
    t < T; nothing else of it is touched); slots: [B] (negative = padding: state read as zeros, nothing
    written); D, dt_bias: [H] or None. Any strides. Returns y: [B, T, H, P] in x's dtype. `block_p` as in
    `mamba2_decode_triton`.
    """
    steps = x.shape[1]
    heads, head_dim, groups, dstate, reps = check_dims(x, B, ssm)
    if heads % groups:
        raise ValueError(f"num_heads {heads} is not a multiple of ngroups {groups}")
    if inter.dtype != torch.float32:
        raise ValueError(f"inter must be float32, got {inter.dtype}")
    if inter.ndim != 5 or inter.shape[1] < steps or tuple(inter.shape[2:]) != (heads, head_dim, dstate):
        raise ValueError(f"inter must be [S, >= {steps}, {heads}, {head_dim}, {dstate}], got {tuple(inter.shape)}")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(x, dt, A, B, C, ssm, slots, D, dt_bias, dt_limit, y, inter, block_p)
    return y
