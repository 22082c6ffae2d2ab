"""Vectorized chunked SSD scan for prefill over flat variable-length batches.

Each sequence is cut into chunks of its own (so a chunk never spans two sequences) and laid on a grid
`[B, Cmax, Q]`; empty grid cells are zero tokens with dt = 0, which leave the state untouched. Within a
chunk the scan is a masked "attention" (C_l . B_s) exp(c_l - c_s) dt_s x_s; across chunks one einsum
over the chunk-level segment sums carries the states. Heads are kept as [G, R] (R = H // G) so B and C
are never expanded to heads. Reading cu_seqlens on the host (for Cmax) is the one sync of this path.

On CUDA (`fla_usable`, see ops/fla_kernels.py) `mamba2_prefill` runs the scan on fla's scalar-gate chunk
kernel instead (`mamba2_prefill_fla`): per head, SSD is simple gated linear attention with
  q = C_t, k = B_t, v = dt_t·x_t, g = dt_t·A (log-gate), scale 1:
  h_t = exp(dt_t·A)·h_{t-1} + (dt_t·x_t)·B_tᵀ  [P, N]   <->   S_t = exp(g_t)·S_{t-1} + v_t·k_tᵀ  [V, K]
  y_t = h_t·C_t + D·x_t                           <->   o_t = S_t·q_t (then + D·x_t here)
so our [P, N] state is fla's V-first state ([V, K], `state_v_first=True`) with no transpose. B and C are
expanded from groups to heads (head h reads group h // (H / G)); dt is processed here (softplus, bias,
limits) before the kernel sees it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridcache.ops.fla_kernels import fla_chunk_simple_gla_v_first, fla_usable
from hybridcache.ops.slot_io import put_rows, read_rows, take_rows
from hybridcache.ops.triton_support import runs_triton
from hybridcache.ops.mamba2.common import (
    NO_LIMIT,
    DtLimit,
    add_skip,
    causal_decay,
    check_dims,
    heads_of_groups,
    process_dt,
)


def _grid(cu_seqlens: Tensor, num_tokens: int, chunk: int) -> tuple[Tensor, Tensor, int]:
    """Grid layout. Returns `src [B * Cmax * Q]` (token index, or num_tokens for an empty cell),
    `where [N]` (grid cell of each token) and Cmax."""
    cu = cu_seqlens.to(torch.long)
    lens = cu[1:] - cu[:-1]
    batch = lens.shape[0]
    cmax = max(1, -(-int(lens.max()) // chunk)) if batch else 1
    rows = torch.repeat_interleave(torch.arange(batch, device=cu.device), lens, output_size=num_tokens)
    local = torch.arange(num_tokens, device=cu.device) - cu[rows]
    where = rows * (cmax * chunk) + local
    src = torch.full((batch * cmax * chunk,), num_tokens, dtype=torch.long, device=cu.device)
    src[where] = torch.arange(num_tokens, device=cu.device)
    return src, where, cmax


def mamba2_chunk_scan_varlen(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    cu_seqlens: Tensor,
    initial_states: Tensor | None = None,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Pure chunked scan (no slots).

    x: [N, H, P]; dt: [N, H] raw; A: [H]; B, C: [N, G, N_state]; cu_seqlens: [B + 1];
    initial_states: [B, H, P, N_state] fp32 or None (zeros). Returns (y [N, H, P] in x's dtype,
    final_states [B, H, P, N_state] fp32).
    """
    num_tokens, heads, head_dim = x.shape
    groups, dstate = B.shape[1:]
    reps = heads // groups
    batch = cu_seqlens.shape[0] - 1
    q = chunk_size
    src, where, cmax = _grid(cu_seqlens.to(x.device), num_tokens, q)
    shape = (batch, cmax, q)

    def grid(t: Tensor) -> Tensor:
        padded = torch.cat([t.float(), t.new_zeros(1, *t.shape[1:]).float()])
        return padded[src].view(*shape, *t.shape[1:])

    cell_used = (src < num_tokens).view(*shape, 1)
    dtg = torch.where(cell_used, process_dt(grid(dt), dt_bias, dt_limit), 0.0)  # [B, Cm, Q, H]
    xg = grid(x)  # [B, Cm, Q, H, P]
    Bg, Cg = grid(B), grid(C)  # [B, Cm, Q, G, N]
    cum = torch.cumsum(dtg * A.float(), dim=2).permute(0, 1, 3, 2).contiguous()  # [B, Cm, H, Q], inclusive
    xdt = (xg * dtg[..., None]).view(*shape, groups, reps, head_dim)

    # 1. inside each chunk: y_l += sum_{s <= l} (C_l . B_s) exp(c_l - c_s) dt_s x_s
    decay = causal_decay(cum)  # [B,Cm,H,Q,Q]
    cb = torch.einsum("bclgn,bcsgn->bcgls", Cg, Bg)
    scores = cb[:, :, :, None] * decay.view(*shape[:2], groups, reps, q, q)
    y = torch.einsum("bcgrls,bcsgrp->bclgrp", scores, xdt)

    # 2. each chunk's own end state (from zero): sum_s exp(c_end - c_s) dt_s x_s B_s^T
    to_end = torch.exp(cum[..., -1:] - cum).view(*shape[:2], groups, reps, q)  # [B,Cm,G,R,Q]
    chunk_states = torch.einsum("bcgrs,bcsgrp,bcsgn->bcgrpn", to_end, xdt, Bg)

    # 3. across chunks: start state of chunk c = sum_{z <= c} exp(total_(z, c]) * state_z, z = -1 initial
    if initial_states is None:
        init = x.new_zeros(batch, heads, head_dim, dstate, dtype=torch.float32)
    else:
        init = initial_states.float()
    states = torch.cat([init.view(batch, 1, groups, reps, head_dim, dstate), chunk_states], dim=1)
    totals = F.pad(cum[..., -1], (0, 0, 1, 0))  # [B, Cm + 1, H]; entry 0 stands for the initial state
    run = torch.cumsum(totals, dim=1)
    tri = torch.ones(cmax + 1, cmax + 1, dtype=torch.bool, device=x.device).tril()
    carry = torch.exp(torch.where(tri[..., None], run[:, :, None] - run[:, None, :], -torch.inf))  # [B,c,z,H]
    carry = carry.view(batch, cmax + 1, cmax + 1, groups, reps)
    starts = torch.einsum("bczgr,bzgrpn->bcgrpn", carry, states)  # state after chunk c - 1
    final = starts[:, -1].reshape(batch, heads, head_dim, dstate)

    # 4. contribution of each chunk's start state: exp(c_l) C_l . h_start
    from_start = torch.exp(cum).view(*shape[:2], groups, reps, q)  # [B,Cm,G,R,Q]
    y_off = torch.einsum("bclgn,bcgrpn->bclgrp", Cg, starts[:, :-1])
    y = y + y_off * from_start.permute(0, 1, 4, 2, 3)[..., None]
    y = add_skip(y.reshape(batch * cmax * q, heads, head_dim)[where], x, D)
    return y.to(x.dtype), final


def mamba2_prefill(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    slots: Tensor,
    has_initial: Tensor,
    cu_seqlens: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
    chunk_size: int = 64,
) -> Tensor:
    """Prefill through slots; see `mamba2_prefill_ref`. x: [N, H, P]; ssm: [S, H, P, N] fp32 (written).
    Returns y: [N, H, P]. On CUDA (`fla_usable`) fla's kernel runs (`mamba2_prefill_fla`); `chunk_size`
    tiles the torch path only."""
    if fla_usable(x):
        return mamba2_prefill_fla(x, dt, A, B, C, ssm, slots, has_initial, cu_seqlens, D, dt_bias, dt_limit)
    check_dims(x, B, ssm)
    valid = slots >= 0
    init = take_rows(ssm, slots, valid & has_initial.to(valid.device))
    y, final = mamba2_chunk_scan_varlen(x, dt, A, B, C, cu_seqlens, init, D, dt_bias, dt_limit, chunk_size)
    put_rows(ssm, (slots,), final, valid)
    return y


def mamba2_prefill_fla(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    ssm: Tensor,
    slots: Tensor,
    has_initial: Tensor,
    cu_seqlens: Tensor,
    D: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_limit: DtLimit = NO_LIMIT,
    chunk_size: int = 64,
) -> Tensor:
    """`mamba2_prefill` on fla's `chunk_simple_gla` (the mapping is in the module docstring).

    x: [N, H, P]; dt: [N, H] raw; A: [H]; B, C: [N, G, N_state] of x's dtype; ssm: [S, H, P, N_state]
    fp32 (written). Initial states are gathered from ssm[slot] (zeros, by a fill, where has_initial is
    false or the row is padding, so NaN in unused slots never reaches the kernel); final states go back
    to the live rows' slots. v = dt·x is formed in fp32 and handed to the kernel in x's dtype (with q, k);
    g = dt·A stays fp32. Where the Triton kernels run, the inputs are one pass and the skip another
    (triton_ssd_io.py); elsewhere (fla's stand-ins in tests) the same arithmetic in torch. Returns
    y: [N, H, P] in x's dtype. `chunk_size` is unused (fla tiles by 64, the same math). No host sync
    here beyond the memoised read of cu_seqlens (ops/fla_kernels.py).
    """
    heads = check_dims(x, B, ssm).heads
    init = read_rows(ssm, slots, has_initial)  # [B, H, P, N] = fla's V-first [N, H, V, K]
    fused = runs_triton(x)
    if fused:  # one pass for the four inputs
        from hybridcache.ops.mamba2.triton_ssd_io import ssd_inputs_triton, ssd_output_triton

        q, k, v, g = ssd_inputs_triton(x, dt, A, B, C, dt_bias, dt_limit)
    else:
        dtp = process_dt(dt, dt_bias, dt_limit)  # [N, H] fp32
        q = heads_of_groups(C, heads).to(x.dtype)  # [N, H, N_state]
        k = heads_of_groups(B, heads).to(x.dtype)
        v = (x.float() * dtp[..., None]).to(x.dtype)  # [N, H, P]
        g = dtp * A.float()  # [N, H]
    o, final = fla_chunk_simple_gla_v_first(q[None], k[None], v[None], g[None], 1.0, init, cu_seqlens)
    put_rows(ssm, (slots,), final, slots >= 0)
    if D is None:
        return o[0].to(x.dtype)
    if fused:
        return ssd_output_triton(o[0], x, D)
    return add_skip(o[0].float(), x, D).to(x.dtype)
