"""A Gated DeltaNet or KDA mixer's decode between its two projections as one Triton launch: the causal conv
update, the gated delta rule's decode and the gated RMSNorm per value head, where the models otherwise launch
three kernels (`conv1d/triton_conv._update_kernel`, `delta_rule_triton._delta_rule_decode_kernel`,
`rms_norm_triton._rms_norm_kernel`). At batch 1 a step is bound by its chain of launches, not by bandwidth
(docs/benchmarks.md), so two fewer launches a layer is what this is for.

Same values as the three launches, with the same rounding points: the conv's output rounded to the input's
dtype, o rounded to v's dtype before the norm. One T = 1 token a row (plain decode; verify keeps its kernels).

Work split. One program takes one (row, key head): the conv of the head's q and k channels and of the v
channels of its GROUP = HV / H value heads, then per value head the whole [K, V] state tile (the norm needs
the head's whole V row, so value columns are not split over programs as the plain decode kernel splits them).
Every conv window channel belongs to exactly one program, which reads all of its window before it writes any
of it (a barrier between), so no program can read a window another has shifted. Padding rows (slot < 0) read
no window and no state, write neither, and output zeros.

Inputs are the projection's output columns read in place: qkv [B, C] (C = 2·H·K + HV·V, q | k | v), the
gate's raw a/g_raw and b, the norm's gate z; conv [S, C, W + k] and ssm [S, HV, K, V] any strides.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from .conv1d.triton_conv import activate, conv_taps, update_seq
from .delta_rule_triton import gdn_raw_gate, kda_raw_gate, unit_last
from .delta_rule_verify_triton import key_l2norm
from .pdl_triton import pdl_entry, pdl_launch
from .rms_norm_triton import _TL_DTYPE, SIGMOID, SILU, gated_head_norm

if TYPE_CHECKING:
    from .gdn.decode import RawGate
    from .kda.gate import KDARawGate

NUM_WARPS = 8  # a [128, 128] fp32 state tile is 64 registers a thread at 8 warps


@triton.jit
def _conv(x_row, cw_ptr, conv_row, c, c_ok, live, stride_wc, stride_wk, stride_sc, stride_sj, WIDTH: tl.constexpr):
    """The conv update of channels c [N] for the row's one token, as `_update_kernel` computes it: (y [N, 1]
    fp32, silu applied and rounded to the input's dtype; the window's new columns [N, BJ], fp32)."""
    W: tl.constexpr = WIDTH - 1
    window = conv_row + c[:, None] * stride_sc
    t = tl.arange(0, 1)[None, :]
    acc = conv_taps(tl.zeros([c.shape[0], 1], tl.float32), x_row, cw_ptr, window, t, t < 1, live, c, c_ok, 0, 1,
                    stride_wc, stride_wk, stride_sj, WIDTH)
    j = tl.arange(0, triton.next_power_of_2(W))[None, :]
    kept = update_seq(x_row, window, j + 1, j < W, live, c, c_ok, 0, 1, stride_sj, W)
    return activate(acc, True).to(x_row.dtype.element_ty).to(tl.float32), kept


@triton.jit
def _store_window(conv_row, kept, c, c_ok, live, stride_sc, stride_sj, WIDTH: tl.constexpr):
    W: tl.constexpr = WIDTH - 1
    j = tl.arange(0, triton.next_power_of_2(W))[None, :]
    tl.store(conv_row + c[:, None] * stride_sc + j * stride_sj, kept.to(conv_row.dtype.element_ty),
             mask=live & (j < W) & c_ok[:, None])


@triton.jit
def _mixer_decode_kernel(
    x_ptr, cw_ptr, conv_ptr, slot_ptr, init_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, ssm_ptr, z_ptr, nw_ptr, out_ptr,
    scale, eps, H,
    stride_xb, stride_wc, stride_wk, stride_cs, stride_cc, stride_cj,
    stride_gb, stride_gh, stride_bb, stride_bh,
    stride_ss, stride_sh, stride_sk, stride_sv,
    stride_zb, stride_zh,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GROUP: tl.constexpr,
    WIDTH: tl.constexpr, PER_KEY_GATE: tl.constexpr, HAS_INITIAL: tl.constexpr, MODE: tl.constexpr,
    MID: tl.constexpr, PDL: tl.constexpr,
):
    """One (row, key head). PER_KEY_GATE: KDA (g_ptr g_raw [B, H, K], beta_ptr b [B, H], A_log [H], dt_bias
    [H·K]); else GDN (a, b [B, HV], A_log, dt_bias [HV]). MODE: the norm, SILU (GDN) or SIGMOID (KDA)."""
    pdl_entry(PDL)
    pid = tl.program_id(0)
    b = (pid // H).to(tl.int64)
    hk = pid % H
    slot = tl.load(slot_ptr + b).to(tl.int64)
    live = slot >= 0
    read = live
    if HAS_INITIAL:
        read = read & (tl.load(init_ptr + b) != 0)
    x_row = x_ptr + b * stride_xb
    conv_row = conv_ptr + tl.maximum(slot, 0) * stride_cs
    X: tl.constexpr = x_ptr.dtype.element_ty
    B_DTYPE: tl.constexpr = beta_ptr.dtype.element_ty

    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    mk, mv = rk < K, rv < V
    cq, ck = hk * K + rk, (H + hk) * K + rk
    q, q_kept = _conv(x_row, cw_ptr, conv_row, cq, mk, live, stride_wc, stride_wk, stride_cc, stride_cj, WIDTH)
    k, k_kept = _conv(x_row, cw_ptr, conv_row, ck, mk, live, stride_wc, stride_wk, stride_cc, stride_cj, WIDTH)
    q = key_l2norm(tl.sum(q, 1), PER_KEY_GATE) * scale
    k = key_l2norm(tl.sum(k, 1), PER_KEY_GATE)
    if PER_KEY_GATE:
        neg_A = -tl.exp(tl.load(alog_ptr + hk).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + hk * K + rk, mask=mk, other=0.0).to(tl.float32)
        g_raw = tl.load(g_ptr + b * stride_gb + hk * stride_gh + rk, mask=mk, other=0.0).to(tl.float32)
        beta_raw = tl.load(beta_ptr + b * stride_bb + hk * stride_bh).to(tl.float32)
        decay, beta = kda_raw_gate(g_raw, beta_raw, neg_A, dt_bias, B_DTYPE)
        decay = tl.exp(decay)[:, None]
    w = tl.load(nw_ptr + rv, mask=mv, other=0.0).to(tl.float32)

    for j in tl.static_range(GROUP):
        hv = hk * GROUP + j
        state = ssm_ptr + tl.maximum(slot, 0) * stride_ss + hv * stride_sh
        tile = state + rk[:, None] * stride_sk + rv[None, :] * stride_sv
        h = tl.load(tile, mask=read & mk[:, None] & mv[None, :], other=0.0).to(tl.float32)
        cv = 2 * H * K + hv * V + rv
        v, v_kept = _conv(x_row, cw_ptr, conv_row, cv, mv, live, stride_wc, stride_wk, stride_cc, stride_cj, WIDTH)
        z = tl.load(z_ptr + b * stride_zb + hv * stride_zh + rv, mask=mv, other=0.0).to(tl.float32)
        if not PER_KEY_GATE:
            neg_A = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
            a = tl.load(g_ptr + b * stride_gb + hv * stride_gh).to(tl.float32)
            beta_raw = tl.load(beta_ptr + b * stride_bb + hv * stride_bh).to(tl.float32)
            g, beta = gdn_raw_gate(a, beta_raw, neg_A, tl.load(dtb_ptr + hv).to(tl.float32), B_DTYPE)
            decay = tl.exp(g)
        h = h * decay
        u = beta * (tl.sum(v, 1) - tl.sum(h * k[:, None], 0))
        h = h + k[:, None] * u[None, :]
        o = tl.sum(h * q[:, None], 0).to(X).to(tl.float32)  # rounded as the plain decode stores it
        n = o * tl.rsqrt(tl.math.div_rn(tl.sum(o * o, 0), V * 1.0) + eps)
        out = tl.where(live, gated_head_norm(n, w, z, MODE, X, MID), 0.0)
        tl.store(out_ptr + (b * GROUP * H + hv) * V + rv, out.to(out_ptr.dtype.element_ty), mask=mv)
        tl.store(tile, h.to(ssm_ptr.dtype.element_ty), mask=live & mk[:, None] & mv[None, :])
        tl.debug_barrier()  # the v channels' window read above before its store
        _store_window(conv_row, v_kept, cv, mv, live, stride_cc, stride_cj, WIDTH)
    _store_window(conv_row, q_kept, cq, mk, live, stride_cc, stride_cj, WIDTH)
    _store_window(conv_row, k_kept, ck, mk, live, stride_cc, stride_cj, WIDTH)


def delta_rule_mixer_decode_triton(
    qkv: Tensor,
    conv_weight: Tensor,
    conv: Tensor,
    slots: Tensor,
    has_initial: Tensor | None,
    ssm: Tensor,
    gate: RawGate | KDARawGate,
    norm_gate: Tensor,
    norm_weight: Tensor,
    eps: float,
    num_key_heads: int,
    scale: float | None = None,
    num_warps: int | None = None,
) -> Tensor:
    """One token a row through a GDN or KDA mixer's conv, decode and gated norm, one launch.

    qkv [B, C] the conv input (C = 2·H·K + HV·V: q | k | v, a unit last stride; read in place); conv_weight
    [C, WIDTH]; conv [S, C, W + k] and ssm [S, HV, K, V] fp32 (any strides, written in place); slots [B]
    int (negative: padding); has_initial [B] bool or None (false: the state starts from zeros; the window is
    read either way, as `causal_conv1d_update` reads it). `gate`: GDN's `RawGate` (a, b [B, HV], any
    strides, a unit last one) or KDA's `KDARawGate` (g_raw [B, H, K], b [B, H]), its T dimension dropped.
    norm_gate [B, HV, V] (GDN's z: `GatedRMSNorm`, silu) or [B, H, K] (KDA's gate: `SigmoidGatedRMSNorm`,
    sigmoid); norm_weight [V]. Returns the normalised, gated o [B, HV, V] in qkv's dtype (zeros for padding
    rows), as the three launches' `norm(decode(conv_update(qkv)), norm_gate)` would give it.
    """
    B, C = qkv.shape
    H = num_key_heads
    HV, K, V = ssm.shape[1:]
    kda = hasattr(gate, "g_raw")
    assert C == 2 * H * K + HV * V and HV % H == 0 and conv.shape[1] == C, "shapes disagree"
    assert norm_gate.shape == (B, HV, V) and norm_weight.shape == (V,), f"norm gate {tuple(norm_gate.shape)}"
    if kda:
        assert H == HV and gate.g_raw.shape == (B, H, K) and gate.b.shape == (B, H), "KDA's raw gate"
    else:
        assert gate.a.shape == gate.b.shape == (B, HV), "GDN's raw gate: a, b [B, HV]"
    out = torch.empty(B, HV, V, dtype=qkv.dtype, device=qkv.device)
    if B == 0:
        return out
    qkv, norm_gate = unit_last(qkv), unit_last(norm_gate)
    g_raw = unit_last(gate[0])
    A_log, dt_bias = gate.A_log.reshape(-1).contiguous(), gate.dt_bias.reshape(-1).contiguous()
    init = slots if has_initial is None else has_initial.to(slots.device)  # unread without has_initial
    mode = SIGMOID if kda else SILU
    mid = torch.promote_types(norm_weight.dtype, qkv.dtype)
    _mixer_decode_kernel[(B * H,)](
        qkv, conv_weight, conv, slots, init, g_raw, gate[1], A_log, dt_bias, ssm, norm_gate, norm_weight, out,
        K ** -0.5 if scale is None else scale, eps, H,
        qkv.stride(0), conv_weight.stride(0), conv_weight.stride(1), conv.stride(0), conv.stride(1), conv.stride(2),
        g_raw.stride(0), g_raw.stride(1), gate[1].stride(0), gate[1].stride(1),
        *ssm.stride(),
        norm_gate.stride(0), norm_gate.stride(1),
        K=K, V=V, BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V), GROUP=HV // H,
        WIDTH=conv_weight.shape[1], PER_KEY_GATE=kda, HAS_INITIAL=has_initial is not None, MODE=mode.value,
        MID=_TL_DTYPE[mid], num_warps=num_warps or NUM_WARPS, **pdl_launch(qkv),
    )
    return out
