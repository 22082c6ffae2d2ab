"""The checkpoint's share of a Mamba2 verify step's outputs, C_t·h[p] for every new token t, as one streaming
Triton kernel: the bandwidth-bound half of the replay verify (`triton_verify.py`, SPLIT).

The verify kernel in one piece holds the whole [P, N] fp32 tile beside the history's and the closed form's
operands: 255 registers a thread at sm_90, two programs an SM, and its state reads wait on the chain of small
dependent loads (slot, pnat, the history's cumsum) before them. Here each program only reads a small tile of
`ssm[slot, head]` (about `triton_decode.TILE` entries, the decode kernel's occupancy) and the group's C rows,
and writes T fp32 rows of P: 4 KiB a (row, head) at T = 4 against the tile's 32 KiB. A padding row (slot < 0)
reads no state and writes zeros.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridcache.ops.mamba2.triton_decode import default_block_p
from hybridcache.ops.pdl_triton import pdl_entry, pdl_launch
from hybridcache.ops.triton_support import num_sms


@triton.jit
def _checkpoint_outputs_kernel(
    C_ptr, ssm_ptr, slot_ptr, out_ptr,
    sC_b, sC_t, sC_g, sC_n,
    ss_s, ss_h, ss_p, ss_n,
    s_slot,
    STEPS: tl.constexpr, HEAD_DIM: tl.constexpr, DSTATE: tl.constexpr, REPS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    """One (row, head, block of BLOCK_P channels): out[row, head, t, p] = Σ_n C[row, t, group, n]·ssm[slot, head,
    p, n] in fp32, out [B, H, T, P] contiguous."""
    pdl_entry(PDL)
    row, head, pblk = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slot_ptr + row * s_slot).to(tl.int64)
    valid = slot >= 0
    pp = pblk * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = pp < HEAD_DIM
    nn = tl.arange(0, BLOCK_N)
    n_ok = nn < DSTATE
    h = tl.load(ssm_ptr + tl.maximum(slot, 0) * ss_s + head * ss_h + pp[:, None] * ss_p + nn[None, :] * ss_n,
                mask=p_ok[:, None] & n_ok[None, :] & valid, other=0.0)
    c_row = C_ptr + row * sC_b + (head // REPS) * sC_g + nn * sC_n
    out_row = out_ptr + (row * tl.num_programs(1) + head) * STEPS * HEAD_DIM + pp
    for t in tl.static_range(STEPS):
        c = tl.load(c_row + t * sC_t, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(out_row + t * HEAD_DIM, tl.sum(h * c[None, :], 1), mask=p_ok)


def checkpoint_outputs_triton(C: Tensor, ssm: Tensor, slots: Tensor, block_p: int | None = None) -> Tensor:
    """C [B, T, G, N] (any strides); ssm [S, H, P, N] fp32 (any strides; read only); slots [B] (negative:
    padding). Returns [B, H, T, P] fp32: C[b, t, g(h)]·ssm[slots[b], h, p] over N, zeros for padding rows.
    `block_p` (channels a program, a power of two) defaults to the decode kernel's rule."""
    batch, steps, groups, dstate = C.shape
    heads, head_dim = ssm.shape[1:3]
    out = torch.empty(batch, heads, steps, head_dim, dtype=torch.float32, device=C.device)
    if out.numel() == 0:
        return out
    if block_p is None:
        block_p = default_block_p(batch, heads, head_dim, dstate, num_sms(C.device))
    _checkpoint_outputs_kernel[(batch, heads, triton.cdiv(head_dim, block_p))](
        C, ssm, slots, out, *C.stride(), *ssm.stride(), slots.stride(0),
        STEPS=steps, HEAD_DIM=head_dim, DSTATE=dstate, REPS=heads // groups,
        BLOCK_P=block_p, BLOCK_N=triton.next_power_of_2(dstate), num_warps=4, **pdl_launch(C),
    )
    return out
