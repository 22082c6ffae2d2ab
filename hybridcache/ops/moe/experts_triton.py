"""Routed experts for small token counts in two Triton launches, no host sync (CUDA-graph capturable).

With x [N, D], index / weight [N, k] from a router and P = N·k token copies ("pairs", p = n·k + j); with a
shared expert (`shared`: an expert every token takes, summed after the routed ones) of intermediate size
S = M·I each token has k + M pairs, p = n·(k + M) + j, pair k + s the shared expert's rows s·I .. s·I + I
(its weights in their own tensors), so that h's rows n·(k + M) + k .. + M - 1 are one row of its S:

  kernel 1, grid (⌈P / BLOCK_P⌉, ⌈I / BLOCK_ROWS⌉):  e = index[p];  u = rnd_W(up[e] · x[n]),  g = rnd_W(gate[e] · x[n])
           gated:      h[p] = rnd_W(rnd_W(act(g)) · u)        non-gated:  h[p] = rnd_W(act(u))
           gate logit: logit[n] = rnd_W(gate_logit · x[n])   (token n's pair k, first row tile)
  kernel 2, grid (⌈N / BLOCK_N⌉, ⌈D / BLOCK_ROWS⌉):  for j in 0..k-1, in order (one program, no atomics):
           y = rnd_O(rnd_W(down[e_j] · h[n·k + j]));  total = rnd_O(total + rnd_O(rnd_M(y · weight[n, j])))
           shared:     y = rnd_O(rnd_W(down_s · h_s[n]))  over all S;  with a gate logit (O = W)
                       y = rnd_W(rnd_W(sigmoid(logit[n])) · y);  total = rnd_O(total + y)   (after the k above)

W is the weights' (and x's) dtype, O the output dtype, M = promote(O, weight's dtype); act runs in fp32.
These are the roundings of `models/layers/experts.py`'s paths: every GEMM's output is stored in W, the
activation and the gate product each round once, each expert's output is stored in O, multiplied by its
router weight in the promoted dtype and summed in O in k order (`dense`; index_add's adds of a token's k
copies are the same adds); the shared expert's sigmoid gate and product round to W as Qwen3-Next's
`routed + sigmoid(gate) * shared` does (`activation_triton.sigmoid_gated_add_triton`). The dot products accumulate in fp32 in another order than torch's GEMMs, so a
16-bit intermediate now and then lands one ulp away; fp32 agrees to a few 1e-6 relative.

Pairs run on grid axis 0, so the programs of one weight tile for every pair are launched together: pairs
that share an expert then read that tile from L2 once it is there. Each pair still costs its expert's full
weight read in the worst case, which is why the forwards use this path only up to `MAX_PAIRS` copies.
On CUDA BLOCK_P = BLOCK_N = 1; Triton's CPU interpreter, which pays per operation, takes them all at once.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..pdl_triton import pdl_entry, pdl_launch
from ..rms_norm_triton import _round, _sigmoid
from ..triton_support import num_sms
from . import SharedExpert

RELU2, RELU, SILU, GELU = (tl.constexpr(a) for a in range(4))  # the kernels' ACT
_ACT = {"relu2": RELU2, "relu": RELU, "silu": SILU, "gelu": GELU}
# tl.reduce(v, axis, _SUM) is tl.sum(v, axis) on fp32 without the nested jit call that costs the interpreter ~1 ms
# (tl.sum and tl.zeros are jit functions, tl.reduce and tl.full builtins)
_SUM = tl.standard._sum_combine
TILE = 4096  # weight elements a program reads per loop step (32 fp32 products a thread at 4 warps)
MIN_ROWS, MAX_ROWS = 4, 64  # output rows a program
INTERPRETER_BLOCK = 1 << 20  # weight elements a program gathers at once in the interpreter
# Kernel 1 loads each weight step twice, masked: the routed expert's rows and the shared expert's (a pair's rows are
# one or the other). One load through a pointer chosen per pair (tl.where on the two) compiled to 96 registers
# against 157 at qwen3_next's batch-1 tiling, but sm_90 then issued the step's loads one after another into the same
# registers, each waiting for the products of the one before (benchmarks/kernel_registers.py: 3 of its loads ahead
# of the first product, against 19). With it, qwen3_next's batch-1 graph step ran 1,120-1,139 tok/s on an H100
# (session 51, history 35250ef; up and down kernels 0.258 + 0.197 ms of GPU time a step) where the session before
# had 1,215-1,224 (0.204 + 0.129 ms) on another H100; not timed against each other on one machine.
# Kernel 2's input rows h loaded in the weight tile's layout, [BLOCK, BLOCK_ROWS, BLOCK_IN] with every row the same
# (L1 hits), as `gemv_triton` loads x, instead of [BLOCK, BLOCK_IN] broadcast over the rows: compiled for sm_90 at
# qwen3_next's 1B batch-1 tiling (benchmarks/sm90_compile.py), 10 barriers against 22 and 50 registers against 58,
# kimi_linear's 10 against 16. Kernel 1 keeps its broadcast x: loaded in the tile it took 168 registers against 157
# with no barrier fewer. Timed only with the routers' WEIGHTS_BEFORE_WAIT beside it (routers_triton.py).
X_IN_TILE = True
# Kernel 2 as one gather did not pay (DOWN_GATHERED: a token's routed experts and shared-expert parts read as one
# [pairs, rows, step] tile a step, where `_down_kernel` takes the pairs one memory round trip after another; history
# c823c12): H100, batch-1 CUDA-graph decode steps (benchmarks/gpu/gemv_steps.sh), tok/s off / on, kimi_linear 1,579
# and 1,594 (two off runs) / 1,574 (replay 0.59 / 0.60 ms), qwen3_next 1,230 and 1,225 / 1,203 (0.78 / 0.79 ms).
# Nor did kernel 1's loop in Triton's software pipeline with it (UP_STAGES 3: cp.async 2 steps ahead): kimi_linear
# 1,523, qwen3_next 1,196 tok/s.


@triton.jit
def activation(v, ACT: tl.constexpr):
    """ACT of fp32 v, in fp32 as torch computes it on a float tensor (GELU: the erf form, torch's default)."""
    if ACT == RELU2:
        return tl.maximum(v, 0.0) * tl.maximum(v, 0.0)
    elif ACT == RELU:
        return tl.maximum(v, 0.0)
    elif ACT == SILU:
        return tl.math.div_rn(v, 1.0 + tl.exp(-v))
    return 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))


@triton.jit
def _in_tile(ptr, row_at, c, rows, live, width):
    """A program's input rows at columns c in fp32, loaded as [BLOCK, BLOCK_ROWS, BLOCK_IN] (every weight row the
    same: the weight tile's own layout, so the product needs no shared-memory round trip to broadcast them);
    `row_at` [BLOCK, 1, 1] the rows' offsets, zeros past `width` and for rows not live."""
    return tl.load(ptr + row_at + (c[None, None, :] + 0 * rows[None, :, None]),
                   mask=live[:, None, None] & (c < width)[None, None, :], other=0.0).to(tl.float32)


@triton.jit
def _up_kernel(x_ptr, index_ptr, gate_ptr, up_ptr, shared_gate_ptr, shared_up_ptr, logit_w_ptr, h_ptr, logit_ptr, P,
               stride_xn, stride_we, stride_wi, stride_si, K: tl.constexpr, I: tl.constexpr, D: tl.constexpr,
               ACT: tl.constexpr, GATED: tl.constexpr, M: tl.constexpr, LOGIT: tl.constexpr,
               BLOCK_P: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_IN: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)  # [BLOCK_P] pairs
    rows = tl.program_id(1) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    live = p < P
    KP: tl.constexpr = K + M  # pairs a token
    n, j = (p // KP).to(tl.int64), p % KP
    routed = live & (j < K)
    e = tl.load(index_ptr + n * K + j, mask=routed, other=0).to(tl.int64)
    w_rows = (e * stride_we)[:, None, None] + (rows.to(tl.int64) * stride_wi)[None, :, None]  # [BLOCK_P, R, 1]
    row_ok = live[:, None, None] & (rows < I)[None, :, None]
    routed_ok = row_ok & routed[:, None, None]
    shared_ok = row_ok & (j >= K)[:, None, None]  # none without M
    # shared pair K + s takes the shared expert's rows s·I + rows
    s_rows = ((j - K).to(tl.int64) * I)[:, None, None] + rows.to(tl.int64)[None, :, None]
    s_rows = tl.where(shared_ok, s_rows, 0) * stride_si
    # the gate logit once a token: its first shared pair's programs of the first row tile
    logit_ok = live & (j == K) & (tl.program_id(1) == 0)
    acc_u = tl.full([BLOCK_P, BLOCK_ROWS, BLOCK_IN], 0.0, tl.float32)
    acc_g = tl.full([BLOCK_P, BLOCK_ROWS, BLOCK_IN], 0.0, tl.float32)
    acc_l = tl.full([BLOCK_P, BLOCK_IN], 0.0, tl.float32)
    for c0 in range(0, D, BLOCK_IN):
        c = c0 + tl.arange(0, BLOCK_IN)
        xv = tl.load(x_ptr + n[:, None] * stride_xn + c[None, :], mask=live[:, None] & (c < D)[None, :], other=0.0)
        xv = xv.to(tl.float32)
        if LOGIT:
            acc_l += tl.load(logit_w_ptr + c[None, :] + 0 * p[:, None], mask=logit_ok[:, None] & (c < D)[None, :],
                             other=0.0).to(tl.float32) * xv
        xv = xv[:, None, :]
        c_ok = (c < D)[None, None, :]
        u = tl.load(up_ptr + w_rows + c[None, None, :], mask=routed_ok & c_ok, other=0.0).to(tl.float32)
        if M > 0:
            u += tl.load(shared_up_ptr + s_rows + c[None, None, :], mask=shared_ok & c_ok, other=0.0).to(tl.float32)
        acc_u += u * xv
        if GATED:
            g = tl.load(gate_ptr + w_rows + c[None, None, :], mask=routed_ok & c_ok, other=0.0).to(tl.float32)
            if M > 0:
                g += tl.load(shared_gate_ptr + s_rows + c[None, None, :], mask=shared_ok & c_ok,
                             other=0.0).to(tl.float32)
            acc_g += g * xv
    # rounding by `_round` only where W is narrower than fp32 (a nested call costs the interpreter ~1 ms)
    W: tl.constexpr = up_ptr.dtype.element_ty
    NARROW: tl.constexpr = W != tl.float32
    if LOGIT:  # the logit as the shared expert's GEMM stores its extra row: in W
        logit = tl.reduce(acc_l, 1, _SUM)
        if NARROW:
            logit = _round(logit, W)
        tl.store(logit_ptr + n, logit, mask=logit_ok)
    v = tl.reduce(acc_g if GATED else acc_u, 2, _SUM)  # [BLOCK_P, R]
    if NARROW:
        v = _round(v, W)
    v = activation(v, ACT)
    if NARROW:
        v = _round(v, W)
    if GATED:
        u = tl.reduce(acc_u, 2, _SUM)
        if NARROW:
            v = _round(v * _round(u, W), W)
        else:
            v = v * u
    out = p.to(tl.int64)[:, None] * I + rows[None, :]
    tl.store(h_ptr + out, v.to(W), mask=live[:, None] & (rows < I)[None, :])


@triton.jit
def _down_kernel(h_ptr, index_ptr, weight_ptr, down_ptr, shared_down_ptr, logit_ptr, out_ptr, N, stride_we,
                 stride_wd, stride_sd, K: tl.constexpr, I: tl.constexpr, D: tl.constexpr, M: tl.constexpr,
                 LOGIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_IN: tl.constexpr,
                 X_TILED: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] tokens
    rows = tl.program_id(1) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    live = n < N
    n = n.to(tl.int64)
    row_ok = live[:, None, None] & (rows < D)[None, :, None]
    W: tl.constexpr = down_ptr.dtype.element_ty
    O: tl.constexpr = out_ptr.dtype.element_ty
    total = tl.full([BLOCK_N, BLOCK_ROWS], 0.0, tl.float32)
    KP: tl.constexpr = K + M  # pairs a token
    for j in tl.static_range(K + (M > 0)):
        p = n * KP + j  # the pair's row of h; the shared expert's M rows from n·KP + K on are one row of M·I
        if j < K:
            e = tl.load(index_ptr + n * K + j, mask=live, other=0).to(tl.int64)
            w_rows = down_ptr + (e * stride_we)[:, None, None] + (rows.to(tl.int64) * stride_wd)[None, :, None]
            INNER = I
        else:  # the shared expert, over its M·I
            w_rows = shared_down_ptr + tl.zeros([BLOCK_N, 1, 1], tl.int64) + \
                (rows.to(tl.int64) * stride_sd)[None, :, None]
            INNER = M * I
        acc = tl.full([BLOCK_N, BLOCK_ROWS, BLOCK_IN], 0.0, tl.float32)
        for c0 in range(0, INNER, BLOCK_IN):
            c = c0 + tl.arange(0, BLOCK_IN)
            if X_TILED:
                hv = _in_tile(h_ptr, p[:, None, None] * I, c, rows, live, INNER)
            else:
                hv = tl.load(h_ptr + p[:, None] * I + c[None, :], mask=live[:, None] & (c < INNER)[None, :],
                             other=0.0).to(tl.float32)[:, None, :]
            mask = row_ok & (c < INNER)[None, None, :]
            acc += tl.load(w_rows + c[None, None, :], mask=mask, other=0.0).to(tl.float32) * hv
        y = tl.reduce(acc, 2, _SUM)  # [BLOCK_N, R]
        if W != tl.float32:  # the GEMM's output in W, then in O (`_round` only where narrower than fp32)
            y = _round(y, W)
        if O != tl.float32 and O != W:
            y = _round(y, O)
        if j < K:  # promote(O, weight's dtype) is O or fp32: no rounding
            y = y * tl.load(weight_ptr + n * K + j, mask=live, other=0.0).to(tl.float32)[:, None]
        elif LOGIT:  # sigmoid(logit) in W (= O), then the product in W; else the shared expert's weight is 1
            g = _sigmoid(tl.load(logit_ptr + n, mask=live, other=0.0))
            if W != tl.float32:
                g = _round(g, W)
            y = y * g[:, None]
        if O != tl.float32:
            total = _round(total + _round(y, O), O)
        else:
            total = total + y
    out = n[:, None] * D + rows[None, :]
    tl.store(out_ptr + out, total.to(O), mask=live[:, None] & (rows < D)[None, :])


def _tiles(count: int, rows: int, inner: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK, BLOCK_ROWS, BLOCK_IN) for `count` programs' worth of pairs (or tokens), each an output of `rows`.

    CUDA: one pair (token) a program; rows a program as few as keeps about 4 programs an SM busy (a power of
    two between MIN_ROWS and MAX_ROWS, so only a handful of variants compile), the inner step filling a
    TILE-element tile. The CPU interpreter pays per operation, not per element: one program takes every
    pair (token), all rows and the whole inner width in one step, up to INTERPRETER_BLOCK elements."""
    if device.type != "cuda":
        block_rows, block_in = triton.next_power_of_2(rows), triton.next_power_of_2(inner)
        fit = max(1, INTERPRETER_BLOCK // (block_rows * block_in))
        return min(triton.next_power_of_2(count), 1 << (fit.bit_length() - 1)), block_rows, block_in
    want = max(1, count * rows // (4 * num_sms(device)))
    block_rows = max(MIN_ROWS, min(MAX_ROWS, triton.next_power_of_2(rows), 1 << (want.bit_length() - 1)))
    return 1, block_rows, max(16, min(triton.next_power_of_2(inner), TILE // block_rows))


def _check(x: Tensor, index: Tensor, weight: Tensor, up: Tensor, down: Tensor, gate: Tensor | None,
           act: str, out_dtype: torch.dtype, shared: SharedExpert | None = None) -> None:
    E, I, D = up.shape
    assert x.ndim == 2 and x.shape[1] == D, f"x {tuple(x.shape)} against up {tuple(up.shape)}"
    assert index.shape == weight.shape and index.ndim == 2 and index.shape[0] == x.shape[0], \
        f"index {tuple(index.shape)}, weight {tuple(weight.shape)}, x {tuple(x.shape)}"
    assert down.shape == (E, D, I), f"down {tuple(down.shape)} against up {tuple(up.shape)}"
    assert gate is None or (gate.shape == up.shape and gate.stride() == up.stride()), "gate must be laid out as up"
    assert up.stride(2) == 1 and down.stride(2) == 1, "expert weights need a unit last stride"
    assert x.dtype == up.dtype == down.dtype, f"x {x.dtype}, weights {up.dtype} / {down.dtype}"
    assert act in _ACT, f"activation {act!r}: the kernels compute {sorted(_ACT)}"
    if shared is not None:
        assert shared.fits(up, down, gate), "the shared expert must be a multiple of a routed one, laid out alike"
        assert shared.gate_logit is None or out_dtype == x.dtype, "a gated shared expert sums in x's dtype"


class SharedArgs(NamedTuple):
    """The shared expert as the kernels take it: its (gate, up, down) pointers (the routed stack's where there
    is none: never read), the row strides of up/gate and of down, `parts` (M), the gate logit's row and the
    [N] fp32 buffer the up kernel writes the logits to (x and a 1-element stand-in without one)."""

    gate: Tensor
    up: Tensor
    down: Tensor
    stride_up: int
    stride_down: int
    parts: int
    logit_row: Tensor
    logits: Tensor


def shared_args(shared: SharedExpert | None, x: Tensor, up: Tensor, down: Tensor) -> SharedArgs:
    if shared is None:
        return SharedArgs(up, up, down, 0, 0, 0, x, x.new_empty(1, dtype=torch.float32))
    logit = shared.gate_logit
    logits = torch.empty(x.shape[0] if logit is not None else 1, device=x.device, dtype=torch.float32)
    return SharedArgs(shared.up if shared.gate is None else shared.gate, shared.up, shared.down, shared.up.stride(0),
                      shared.down.stride(0), shared.parts(up.shape[1]), x if logit is None else logit, logits)


def fused_experts_triton(x: Tensor, index: Tensor, weight: Tensor, up: Tensor, down: Tensor,
                         gate: Tensor | None, act: str, out_dtype: torch.dtype,
                         tiles: tuple[int, int, int] | None = None, shared: SharedExpert | None = None,
                         up_launch: tuple[int, int, int] | None = None,
                         down_launch: tuple[int, int, int] | None = None) -> Tensor:
    """`sum_j weight[:, j] * expert(index[:, j], x)` with expert e = `down[e] · act(gate[e] · x) * (up[e] · x)`
    (gated) or `down[e] · act(up[e] · x)` (gate None), then `+ shared(x)` where there is a shared expert
    (`+ sigmoid(gate_logit · x) * shared(x)` with a gate logit). x: [N, D]; index (int), weight: [N, k];
    up, gate: [E, I, D]; down: [E, D, I]; shared's [S, D], [D, S] -> [N, D] in out_dtype. Two launches,
    whatever the index holds. `tiles` (tests): (BLOCK, BLOCK_ROWS, BLOCK_IN) for both kernels instead of
    `_tiles`' choice, BLOCK the pairs (up) and tokens (down) a program. `up_launch`, `down_launch` (the tiling
    sweep, `benchmarks/tune_moe.py`): (BLOCK_ROWS, BLOCK_IN, num_warps) for one kernel, one pair (token) a
    program; none changes the result."""
    _check(x, index, weight, up, down, gate, act, out_dtype, shared)
    (N, K), (_, I, D) = index.shape, up.shape
    out = torch.empty(N, D, device=x.device, dtype=out_dtype)
    if N == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    index, weight = index.contiguous(), weight.contiguous()
    s = shared_args(shared, x, up, down)
    logit = int(shared is not None and shared.gate_logit is not None)
    pairs = N * (K + s.parts)
    h = torch.empty(pairs, I, device=x.device, dtype=x.dtype)
    (block, rows, inner), warps = _launch(tiles, up_launch, pairs, I, D, x.device)
    _up_kernel[(triton.cdiv(pairs, block), triton.cdiv(I, rows))](
        x, index, up if gate is None else gate, up, s.gate, s.up, s.logit_row, h, s.logits, pairs, x.stride(0),
        up.stride(0), up.stride(1), s.stride_up, K=K, I=I, D=D, ACT=_ACT[act], GATED=gate is not None, M=s.parts,
        LOGIT=logit, BLOCK_P=block, BLOCK_ROWS=rows, BLOCK_IN=inner, num_warps=warps, **pdl_launch(x))
    (block, rows, inner), warps = _launch(tiles, down_launch, N, D, I, x.device)
    _down_kernel[(triton.cdiv(N, block), triton.cdiv(D, rows))](
        h, index, weight, down, s.down, s.logits, out, N, down.stride(0), down.stride(1), s.stride_down,
        K=K, I=I, D=D, M=s.parts, LOGIT=logit, BLOCK_N=block, BLOCK_ROWS=rows, BLOCK_IN=inner, X_TILED=X_IN_TILE,
        num_warps=warps, **pdl_launch(h))
    return out


def _launch(tiles: tuple[int, int, int] | None, launch: tuple[int, int, int] | None, count: int, rows: int,
            inner: int, device: torch.device) -> tuple[tuple[int, int, int], int]:
    """((BLOCK, BLOCK_ROWS, BLOCK_IN), num_warps) of one kernel: `tiles`, else `launch`, else `_tiles`' choice
    with 4 warps."""
    if tiles is not None:
        return tiles, 4
    if launch is not None:
        return (1, launch[0], launch[1]), launch[2]
    return _tiles(count, rows, inner, device), 4
