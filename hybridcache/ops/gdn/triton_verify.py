"""Gated DeltaNet's replay verify as one Triton launch (the work split: `ops/delta_rule_verify_triton.py`):
token by token here, or for T > 1 in closed form (`triton_verify_chunked.py`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..delta_rule_triton import gdn_raw_gate, unit_last
from ..delta_rule_verify_triton import gdn_block_v, key_l2norm, replay_row, state_tile, verify_tile_sizes, verify_warps
from ..pdl_triton import pdl_entry, pdl_launch
from ..triton_support import num_sms
from . import triton_verify_chunked as chunked_form

if TYPE_CHECKING:
    from .decode import RawGate


@triton.jit
def _gdn_verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, o_ptr,
    ssm_ptr, u_ptr, hk_ptr, hG_ptr, hb_ptr, pnat_ptr, buf_ptr, slot_ptr,
    scale,
    s_qb, s_qt, s_qh, s_kib, s_kit, s_kih, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_bib, s_bit, s_bih,
    s_ss, s_sh, s_sk, s_sv,
    s_us, s_ub, s_ut, s_uh, s_uv,
    s_ks, s_kb, s_kt, s_kh, s_kk,
    s_Gs, s_Gb, s_Gh, s_Gt,
    s_bs, s_bb, s_bh, s_bt,
    s_pnat, s_buf,
    T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, HIST: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, RAW_GATE: tl.constexpr, PDL: tl.constexpr,
):
    """Inputs q, k, v, g, beta [B, T, heads, ...] by their strides (s_q*, s_ki*, s_v*, s_g*, s_bi*; unit last);
    RAW_GATE: g_ptr and beta_ptr hold the gate's raw a, b, alog_ptr and dtb_ptr A_log, dt_bias [HV].
    A token's hᵀk and hᵀq are reduced side by side from the undecayed tile, o = e^g·hᵀq + (k·q)·u, its decay and
    update are one pass, and the last token's update is skipped: at T = 1 the tile is only read (H200, us at
    batch 16 / 64 / 256: 17.7 / 79.9 / 274.9 against 19.0 / 85.3 / 293.9 decaying, updating, then reducing hᵀq)."""
    pdl_entry(PDL)
    row, hv, vb = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    hk = hv // (HV // H)  # key head of value head hv
    s, valid, p, b, fold = replay_row(slot_ptr, pnat_ptr, buf_ptr, row, s_pnat, s_buf, T, HIST)
    kk, k_ok, vv, v_ok, tile, ssm_tile, h = state_tile(ssm_ptr, s, hv, vb, valid, s_ss, s_sh, s_sk, s_sv, K, V, BK, BV)

    # effective state: checkpoint plus history [0, p) of buffer b
    G_row = hG_ptr + s * s_Gs + b * s_Gb + hv * s_Gh
    u_row = u_ptr + s * s_us + b * s_ub + hv * s_uh
    k_row = hk_ptr + s * s_ks + b * s_kb + hk * s_kh
    G_last = tl.load(G_row + (p - 1) * s_Gt, mask=p > 0, other=0.0).to(tl.float32)
    h = h * tl.exp(G_last)
    for j in range(0, p):  # rank-1 updates: p <= HIST is small, and no dot layouts to convert between
        w = tl.exp(G_last - tl.load(G_row + j * s_Gt).to(tl.float32))
        u_j = tl.load(u_row + j * s_ut + vv * s_uv, mask=v_ok, other=0.0).to(tl.float32)
        k_j = tl.load(k_row + j * s_kt + kk * s_kk, mask=k_ok, other=0.0).to(tl.float32)
        h += k_j[:, None] * (w * u_j)[None, :]
    tl.store(ssm_tile, h, mask=tile & valid & fold)

    # the new tokens: [p, p + T) of buffer b, or [0, T) of buffer 1 - b after a fold
    nb = tl.where(fold, 1 - b, b)
    pos0 = tl.where(fold, 0, p)
    G = tl.where(fold, 0.0, G_last)
    writes_shared = valid & (vb == 0)
    writes_key = writes_shared & (hv % (HV // H) == 0)
    q_row = q_ptr + row * s_qb + hk * s_qh
    k_in = k_ptr + row * s_kib + hk * s_kih
    v_row = v_ptr + row * s_vb + hv * s_vh
    g_in = g_ptr + row * s_gb + hv * s_gh
    b_in = beta_ptr + row * s_bib + hv * s_bih
    B_DTYPE: tl.constexpr = beta_ptr.dtype.element_ty  # b's dtype, the raw gate rounds beta to it
    if RAW_GATE:
        neg_A = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    for t in tl.static_range(T):
        tok = row * T + t
        q_t = tl.load(q_row + t * s_qt + kk, mask=k_ok, other=0.0).to(tl.float32)
        k_t = tl.load(k_in + t * s_kit + kk, mask=k_ok, other=0.0).to(tl.float32)
        if L2NORM:
            q_t = key_l2norm(q_t, False)
            k_t = key_l2norm(k_t, False)
        q_t = q_t * scale
        v_t = tl.load(v_row + t * s_vt + vv, mask=v_ok, other=0.0).to(tl.float32)
        g_t = tl.load(g_in + t * s_gt).to(tl.float32)
        b_t = tl.load(b_in + t * s_bit).to(tl.float32)
        if RAW_GATE:
            g_t, b_t = gdn_raw_gate(g_t, b_t, neg_A, dt_bias, B_DTYPE)
        e_g = tl.exp(g_t)
        u_t = b_t * (v_t - e_g * tl.sum(h * k_t[:, None], 0))
        o_t = tl.where(valid, e_g * tl.sum(h * q_t[:, None], 0) + tl.sum(k_t * q_t, 0) * u_t, 0.0)
        if t < T - 1:  # the last token's update feeds nothing (nor is the tile stored after the tokens)
            h = h * e_g + k_t[:, None] * u_t[None, :]
        tl.store(o_ptr + (tok * HV + hv) * V + vv, o_t.to(o_ptr.dtype.element_ty), mask=v_ok)
        G += g_t
        pos = pos0 + t
        tl.store(u_ptr + s * s_us + nb * s_ub + pos * s_ut + hv * s_uh + vv * s_uv,
                 u_t.to(u_ptr.dtype.element_ty), mask=v_ok & valid)
        tl.store(hk_ptr + s * s_ks + nb * s_kb + pos * s_kt + hk * s_kh + kk * s_kk,
                 k_t.to(hk_ptr.dtype.element_ty), mask=k_ok & writes_key)
        tl.store(hG_ptr + s * s_Gs + nb * s_Gb + hv * s_Gh + pos * s_Gt, G.to(hG_ptr.dtype.element_ty),
                 mask=writes_shared)
        tl.store(hb_ptr + s * s_bs + nb * s_bb + hv * s_bh + pos * s_bt, b_t.to(hb_ptr.dtype.element_ty),
                 mask=writes_shared)


def chunked_warps(programs: int, device: torch.device) -> int:
    """The closed form's warps: NUM_WARPS, doubled where `programs` leave SMs idle (faster at batch 1)."""
    few = device.type == "cuda" and programs < num_sms(device)
    return chunked_form.NUM_WARPS * (2 if few else 1)


def register_cap(programs: int, device: torch.device) -> int:
    """The closed form's registers a thread (0: no cap): MAX_REGISTERS from CAP_FROM `programs` an SM, where
    more programs resident outweigh the spills."""
    many = device.type == "cuda" and programs >= chunked_form.CAP_FROM * num_sms(device)
    return chunked_form.MAX_REGISTERS if many else 0


def gdn_verify_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    ssm: Tensor,
    replay_u: Tensor,
    replay_k: Tensor,
    replay_G: Tensor,
    replay_beta: Tensor,
    pnat: Tensor,
    buf_idx: Tensor,
    slots: Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    block_v: int | None = None,
    num_warps: int | None = None,
    *,
    gate: RawGate | None = None,
    chunked: bool | None = None,
    key_block: int | None = None,
    max_registers: int | None = None,
) -> Tensor:
    """`gdn_verify` in one launch; same arguments, writes and result (`block_v`, `num_warps`: the tiling,
    which does not change the result).

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; ssm [S, HV, K, V] fp32;
    replay_u [S, 2, HIST, HV, V]; replay_k [S, 2, HIST, H, K]; replay_G, replay_beta [S, 2, HV, HIST];
    pnat, buf_idx [S] int32 (read only); slots [B], negative = padding. The pool roles may be strided views;
    so may q, k, v (copied only without a unit last stride), g and beta (any strides).
    `gate` (g and beta None): a, b [B, T, HV] (any strides), A_log, dt_bias [HV]; g and beta are computed
    in the kernel, the same values as `gate.values()`.
    `chunked`: the new tokens in closed form (`triton_verify_chunked.py`; the default for T > 1, and it needs
    block_v >= 16) or token by token; the results agree within rounding. `key_block` (closed form): the state
    read that many key rows at a time (a power of two >= 16, default `KEY_BLOCK`; K or more: all at once),
    which does not change the result beyond rounding; `max_registers` (closed form): a cap on the registers a
    thread (Triton's maxnreg: more programs an SM, spills where the kernel needs more; 0: none), by default
    `register_cap`'s; the same values either way.
    Returns o [B, T, HV, V] in v's dtype (zeros for padding rows).
    """
    B, T, H, K = q.shape
    HV, V, hist = v.shape[2], v.shape[3], replay_u.shape[2]
    assert T <= hist, f"a verify step of {T} tokens needs HIST >= {T}, have {hist}"
    assert HV % H == 0, f"value heads ({HV}) must be a multiple of key heads ({H})"
    if gate is not None:
        assert g is None and beta is None, "pass g and beta, or gate=, not both"
        g, beta = gate.a, gate.b  # read by the kernel where g, beta would be
        A_log, dt_bias = gate.A_log.contiguous(), gate.dt_bias.contiguous()
        assert A_log.shape == dt_bias.shape == (HV,), "A_log, dt_bias [HV]"
    else:
        A_log = dt_bias = slots  # unused
    assert g.shape == beta.shape == (B, T, HV), f"g, beta {tuple(g.shape)}, {tuple(beta.shape)}: [B, T, HV]"
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if B == 0 or T == 0:
        return o
    q, k, v = unit_last(q), unit_last(k), unit_last(v)
    args = (
        q, k, v, g, beta, A_log, dt_bias, o,
        ssm, replay_u, replay_k, replay_G, replay_beta, pnat, buf_idx, slots.contiguous(),
        K ** -0.5 if scale is None else scale,
        *(x.stride(i) for x in (q, k, v) for i in range(3)), *g.stride(), *beta.stride(),
        *ssm.stride(), *replay_u.stride(), *replay_k.stride(), *replay_G.stride(), *replay_beta.stride(),
        pnat.stride(0), buf_idx.stride(0),
    )
    shapes = dict(T=T, H=H, HV=HV, K=K, V=V, HIST=hist, L2NORM=use_qk_l2norm_in_kernel, RAW_GATE=gate is not None)
    BK, BV = verify_tile_sizes(K, V, block_v or chunked_form.BLOCK_V, B * HV, q.device)
    if chunked is None:  # the closed form's products need 16 value columns or more
        chunked = T > 1 and BV >= 16
    if chunked:
        assert BV >= 16, f"the closed form needs 16 value columns or more, have {BV}"
        programs = B * HV * triton.cdiv(V, BV)
        cap = register_cap(programs, q.device) if max_registers is None else max_registers
        chunked_form._gdn_verify_chunked_kernel[(B, HV, triton.cdiv(V, BV))](
            *args, **shapes, TP=max(16, triton.next_power_of_2(2 * T)),  # the keys, then the queries
            HP=max(16, triton.next_power_of_2(hist)),
            BK=BK, BV=BV, BKC=min(key_block or chunked_form.KEY_BLOCK, BK),
            TOKEN_PRECISION="tf32x3" if v.dtype == torch.float32 else "tf32",
            BF16_STATE=chunked_form.BF16_STATE and v.dtype != torch.float32, UPCAST=not q.is_cuda,
            num_warps=num_warps or chunked_warps(programs, q.device),
            num_stages=chunked_form.NUM_STAGES, **pdl_launch(q), **({"maxnreg": cap} if cap else {}),
        )
        return o
    BK, BV = verify_tile_sizes(K, V, block_v, B * HV, q.device, gdn_block_v(T))
    _gdn_verify_kernel[(B, HV, triton.cdiv(V, BV))](*args, **shapes, BK=BK, BV=BV,
                                                   num_warps=num_warps or verify_warps(T), **pdl_launch(q))
    return o
