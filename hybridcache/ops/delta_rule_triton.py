"""The gated delta rule's decode as one Triton kernel, for Gated DeltaNet and KDA, reading and writing the
state pool's slots in place (no gather, no scatter, no host sync).

Same contract as `gdn_decode` / `kda_decode`. Per value head, state h [K, V] fp32, per token:
  h = exp(g)·h          (g one scalar per value head for GDN, one per key row for KDA)
  u = β·(v − hᵀk);  h = h + k·uᵀ;  o = hᵀ(q·scale)

Work split. One program takes one (value block, batch row, value head) and holds the [BK, BV] fp32 tile
of ssm[slot, hv, :, block] in registers: loaded once (or zeros where the row starts fresh), run through the
row's T tokens, stored once. Value columns of one head are independent in the recurrence (each column
needs hᵀk over its own column only), so value blocks need no communication. Padding rows (slot < 0) load
nothing, store nothing and output zeros; every load of a state is masked, never multiplied by zero, so a
NaN left in an unused or fresh slot cannot leak.

Raw gate (GDN, `gate=RawGate(a, b, A_log, dt_bias)`): the kernel reads the projection's a, b in place of g,
beta and computes `gdn_gate` per token (`gdn_raw_gate`, shared with the verify kernel): g =
−exp(A_log)·softplus(a + dt_bias) in fp32, beta = sigmoid(b) rounded to b's dtype, as the torch rule returns
it, so the recurrence sees the same values as with g, beta precomputed (up to Triton's exp and log, an ulp
or two). KDA's (`gate=KDARawGate(g_raw, b, A_log, dt_bias)`) likewise reads g_raw, b in place of g, beta and
computes `kda_gate` and sigmoid(b) per token (`kda_raw_gate`, shared with the verify kernels).

Not fused with the conv update before it and the gated norm after it (session 53, history 0be99ea): one program per
(row, key head) ran the conv of its q, k and value heads' channels (every window channel owned by one program, so
none reads a window another has shifted), then each value head's whole [K, V] tile and its norm, which needs the
head's whole V row, so value columns could not be split over programs. At batch 1 that is 16 programs of 8 warps
(255 registers, no spills), and it lost to the three launches everywhere. H100, one layer in a CUDA graph of 20
back-to-back calls under PDL, us a call, one launch against three, batch 1 / 4 / 16 / 64 / 256: GDN (qwen3_next's
16 key / 32 value heads of 128) 14.1 / 14.9 / 34.6 / 153.4 / 581.2 against 6.2 / 9.0 / 23.8 / 107.7 / 409.1; KDA
(kimi_linear's 16 heads of 128) 10.7 / 11.0 / 22.4 / 97.2 / 381.2 against 5.8 / 7.5 / 13.9 / 58.7 / 216.4. A launch
in such a chain costs 0.5 (empty) to 1.2 us (a one-row norm; benchmarks/launch_floor.py), so a fusion pays only
where it keeps the split kernels' parallelism.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from .delta_rule_verify_triton import key_l2norm
from .pdl_triton import pdl_entry, pdl_launch
from .rms_norm_triton import _round, _sigmoid
from .triton_support import num_sms

if TYPE_CHECKING:
    from .gdn.decode import RawGate
    from .kda.gate import KDARawGate

MAX_TILE = 4096  # fp32 state elements per program: 32 registers a thread at 4 warps


@triton.jit
def gdn_raw_gate(a, b, neg_A, dt_bias, B_DTYPE: tl.constexpr):
    """`gdn.decode.gdn_gate` for one token of one value head: a, b fp32 (b read in B_DTYPE, its dtype), neg_A =
    −exp(A_log), dt_bias fp32 -> (g, beta) fp32, beta rounded to B_DTYPE as torch's sigmoid(b) returns it.

    softplus as torch's (threshold 20): x > 20 ? x : log1p(exp(x)), log1p(e) = log(u)·e/(u − 1) with
    u = 1 + e (a few ulps; e itself where u rounds to 1; libdevice's log1p is not in Triton's interpreter).
    """
    x = a + dt_bias
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    at_one = u == 1.0
    log1p = tl.where(at_one, e, tl.log(u) * (e / tl.where(at_one, 1.0, u - 1.0)))
    return neg_A * tl.where(x > 20.0, x, log1p), _round(_sigmoid(b), B_DTYPE)


@triton.jit
def kda_raw_gate(g_raw, b, neg_A, dt_bias, B_DTYPE: tl.constexpr):
    """`kda.gate.KDARawGate.values` for one token of one head: g_raw, dt_bias [BK] fp32, b fp32 (read in
    B_DTYPE, its dtype), neg_A = −exp(A_log) -> (g [BK], beta) fp32, beta rounded to B_DTYPE.

    softplus exactly as `kda_gate` writes it: x > 20 ? x : log(1 + exp(x)) (no log1p: where 1 + exp(x)
    rounds to 1 the torch rule gives 0, and so does this).
    """
    x = g_raw + dt_bias
    return neg_A * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0)))), _round(_sigmoid(b), B_DTYPE)


@triton.jit
def _delta_rule_decode_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, ssm_ptr, slot_ptr, init_ptr, o_ptr, inter_ptr,
    scale, HV,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_gb, stride_gt, stride_gh,
    stride_bb, stride_bt, stride_bh,
    stride_ss, stride_sh, stride_sk, stride_sv,
    stride_ob, stride_ot, stride_oh,
    stride_is, stride_it,
    T: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, GROUP: tl.constexpr,
    PER_KEY_GATE: tl.constexpr, HAS_INITIAL: tl.constexpr, L2NORM: tl.constexpr, INTERMEDIATE: tl.constexpr,
    RAW_GATE: tl.constexpr, PDL: tl.constexpr,
):
    """RAW_GATE: g_ptr and beta_ptr hold the gate's raw inputs, GDN's a, b [B, T, HV] (alog_ptr, dtb_ptr:
    A_log, dt_bias [HV]) or KDA's g_raw [B, T, H, K], b [B, T, H] (A_log [H], dt_bias [H·K])."""
    pdl_entry(PDL)
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    b = (i_bh // HV).to(tl.int64)
    hv = i_bh % HV
    hk = hv // GROUP  # the key head this value head reads

    slot = tl.load(slot_ptr + b).to(tl.int64)
    live = slot >= 0
    read = live
    if HAS_INITIAL:
        read = read & (tl.load(init_ptr + b) != 0)

    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    mk, mv = rk < K, rv < V
    state = ssm_ptr + tl.maximum(slot, 0) * stride_ss + hv * stride_sh
    tile = state + rk[:, None] * stride_sk + rv[None, :] * stride_sv
    h = tl.load(tile, mask=read & mk[:, None] & mv[None, :], other=0.0).to(tl.float32)

    q_row = q_ptr + b * stride_qb + hk * stride_qh
    k_row = k_ptr + b * stride_kb + hk * stride_kh
    v_row = v_ptr + b * stride_vb + hv * stride_vh
    beta_row = beta_ptr + b * stride_bb + hv * stride_bh
    o_row = o_ptr + b * stride_ob + hv * stride_oh
    if PER_KEY_GATE:
        g_row = g_ptr + b * stride_gb + hk * stride_gh
    else:
        g_row = g_ptr + b * stride_gb + hv * stride_gh
    B_DTYPE: tl.constexpr = beta_ptr.dtype.element_ty  # b's dtype, the raw gate rounds beta to it
    if RAW_GATE:
        neg_A = -tl.exp(tl.load(alog_ptr + hv).to(tl.float32))
        if PER_KEY_GATE:
            dt_bias = tl.load(dtb_ptr + hk * K + rk, mask=mk, other=0.0).to(tl.float32)
        else:
            dt_bias = tl.load(dtb_ptr + hv).to(tl.float32)
    for t in range(T):
        # every load of the token first: issued together, none waiting on the key norms' reductions
        q = tl.load(q_row + t * stride_qt + rk, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(k_row + t * stride_kt + rk, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(v_row + t * stride_vt + rv, mask=mv, other=0.0).to(tl.float32)
        beta = tl.load(beta_row + t * stride_bt).to(tl.float32)
        if PER_KEY_GATE:
            g = tl.load(g_row + t * stride_gt + rk, mask=mk, other=0.0).to(tl.float32)
        else:
            g = tl.load(g_row + t * stride_gt).to(tl.float32)
        if L2NORM:
            q = key_l2norm(q, PER_KEY_GATE)  # KDA's form or GDN's, as the verify kernels and the torch paths
            k = key_l2norm(k, PER_KEY_GATE)
        q = q * scale
        if PER_KEY_GATE:
            if RAW_GATE:
                g, beta = kda_raw_gate(g, beta, neg_A, dt_bias, B_DTYPE)
            h = h * tl.exp(g)[:, None]
        elif RAW_GATE:
            g, beta = gdn_raw_gate(g, beta, neg_A, dt_bias, B_DTYPE)
            h = h * tl.exp(g)
        else:
            h = h * tl.exp(g)
        u = beta * (v - tl.sum(h * k[:, None], 0))
        h = h + k[:, None] * u[None, :]
        o = tl.where(live, tl.sum(h * q[:, None], 0), 0.0)  # a padding row's inputs may be anything
        tl.store(o_row + t * stride_ot + rv, o.to(o_ptr.dtype.element_ty), mask=mv)
        if INTERMEDIATE:
            inter = inter_ptr + tl.maximum(slot, 0) * stride_is + t * stride_it + hv * stride_sh
            tl.store(inter + rk[:, None] * stride_sk + rv[None, :] * stride_sv, h, mask=live & mk[:, None] & mv[None, :])

    if not INTERMEDIATE:
        tl.store(tile, h.to(ssm_ptr.dtype.element_ty), mask=live & mk[:, None] & mv[None, :])



def default_block_v(rows: int, K: int, V: int, device: torch.device) -> int:
    """Value columns per program: as many as fit a MAX_TILE tile (at most 64), halved down to 16 while the
    grid (rows·⌈V/BV⌉ programs, rows = B·HV) gives under 4 programs per SM. At B = 64, HV = 32,
    K = V = 128 that is BV = 32 and 8192 programs."""
    bk = triton.next_power_of_2(K)
    bv = min(triton.next_power_of_2(V), 64, max(16, MAX_TILE // bk))
    while bv > 16 and rows * triton.cdiv(V, bv) < 4 * num_sms(device):
        bv //= 2
    return bv


def unit_last(x: Tensor) -> Tensor:
    """x itself when its last stride is 1 (a column slice of a wider tensor is read in place), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def delta_rule_decode_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor | None,
    ssm: Tensor,
    slots: Tensor,
    has_initial: Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    block_v: int | None = None,
    intermediate: Tensor | None = None,
    num_warps: int | None = None,
    *,
    gate: RawGate | KDARawGate | None = None,
) -> Tensor:
    """q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV] (GDN) or [B, T, H, K] (KDA, H = HV);
    beta [B, T, HV]; ssm [S, HV, K, V] fp32 (any strides, written in place); slots [B] int (negative:
    padding); has_initial [B] bool or None (false: start from zeros, ssm[slot] is not read).

    Runs each row's T tokens from its slot's state and writes the state after the last one back.
    Returns o [B, T, HV, V] in v's dtype (zeros for padding rows). `block_v` (value columns per program,
    a power of two) defaults to `default_block_v`; it does not change the result. T is a compile-time
    constant: one compile per token count (1 for decode, the draft length + 1 for verify).

    `intermediate` [S, T, HV, K, V] fp32 (contiguous past dim 1): the per-token-states alternative to replay
    (what vLLM and SGLang do for speculation, kept for the benchmarks' side-by-side): the state after each
    token t goes to intermediate[slot, t] and ssm is not written.

    `gate` (g and beta None): GDN's `RawGate`, a, b [B, T, HV] (any strides) and A_log, dt_bias [HV]; or
    KDA's `KDARawGate`, g_raw [B, T, H, K] (a unit last stride read in place), b [B, T, H] (any strides),
    A_log (H elements), dt_bias (H·K elements). The kernel computes g and beta per token (`gdn_raw_gate`,
    `kda_raw_gate`), the same values as `gate.values()`.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    assert HV % H == 0 and k.shape == q.shape and ssm.shape[1:] == (HV, K, V), "shapes disagree"
    if gate is not None:
        assert g is None and beta is None, "pass g and beta, or gate=, not both"
        g, beta = gate[0], gate[1]  # GDN's a or KDA's g_raw, and b: read by the kernel where g, beta would be
        A_log, dt_bias = gate.A_log.reshape(-1).contiguous(), gate.dt_bias.reshape(-1).contiguous()
        gdn = g.shape == beta.shape == (B, T, HV) and A_log.numel() == dt_bias.numel() == HV
        kda = g.shape == (B, T, H, K) and beta.shape == (B, T, H) and A_log.numel() == H and dt_bias.numel() == H * K
        assert gdn or kda, "a raw gate is GDN's (a, b [B, T, HV], A_log, dt_bias [HV]) or KDA's (g_raw [B, T, H, " \
            "K], b [B, T, H], A_log [H], dt_bias [H·K])"
    else:
        A_log = dt_bias = slots  # unused
    per_key = g.ndim == 4
    assert g.shape == ((B, T, H, K) if per_key else (B, T, HV)), f"g {tuple(g.shape)} fits neither gate"
    assert not per_key or H == HV, "KDA has one value head per key head"
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=v.device)
    if B == 0 or T == 0:
        return o.zero_()
    q, k, v = unit_last(q), unit_last(k), unit_last(v)
    if per_key:
        g = unit_last(g)
        g_strides = (g.stride(0), g.stride(1), g.stride(2))
    else:
        g_strides = g.stride()
    init = slots if has_initial is None else has_initial.to(slots.device)  # unread without has_initial
    # measured on the H200 (benchmarks/tune_delta_rule.py): one warp per program once a row runs several
    # tokens (the per-token reductions stay inside a warp), 16 columns when every token's state is stored
    bv = block_v or (16 if intermediate is not None else default_block_v(B * HV, K, V, q.device))
    warps = num_warps or (1 if T > 1 else (4 if triton.next_power_of_2(K) * bv > MAX_TILE else 2))
    bk = triton.next_power_of_2(K)
    _delta_rule_decode_kernel[(triton.cdiv(V, bv), B * HV)](
        q, k, v, g, beta, A_log, dt_bias, ssm, slots, init, o, ssm if intermediate is None else intermediate,
        K ** -0.5 if scale is None else scale, HV,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        *g_strides,
        beta.stride(0), beta.stride(1), beta.stride(2),
        *ssm.stride(),
        o.stride(0), o.stride(1), o.stride(2),
        *((intermediate.stride(0), intermediate.stride(1)) if intermediate is not None else (0, 0)),
        T=T, K=K, V=V, BK=bk, BV=bv, GROUP=HV // H,
        PER_KEY_GATE=per_key, HAS_INITIAL=has_initial is not None, L2NORM=use_qk_l2norm_in_kernel,
        INTERMEDIATE=intermediate is not None, RAW_GATE=gate is not None, num_warps=warps, **pdl_launch(q),
    )
    return o
