"""Causal depthwise conv1d over the pool's conv windows as Triton kernels: no gather, no scatter, no host sync.

Same contracts as `fast.causal_conv1d_update` and `fast.causal_conv1d_prefill`. The conv role is
`conv [S, C, W + k]` (any strides, e.g. one layer of a bigger pool), W = K - 1, the window
`conv[s, :, :W]` oldest input first. Inputs are read in their own dtype, arithmetic is fp32, written
window entries are the inputs converted to the role's dtype (bit for bit what the torch path writes).

Update (decode T = 1, verify T = k + 1): one program per (row, block of BLOCK_C channels). Over the row's
sequence `seq = cat(window, x)` [C, W + T], tap i of output t reads `seq[:, t + i]`: a window column when
t + i < W, else token t + i - W. The program then writes `seq[:, 1:]` into `conv[slot, :, :W + T - 1]`;
it reads everything it needs before a barrier, so its own stores cannot overwrite a column still unread.

Prefill (flat varlen): two launches. The first takes (block of BLOCK_T flat tokens, channel block); each
token finds its row by a binary search over `cu_seqlens` on the device, and tap i of token n reads flat
token n + i - W when that is in the row, else column n + i - W - start + W of the row's initial window.
The second, one program per (row, channel block), writes the row's last W inputs into its window. Two
launches because a row's first tokens read the very window its last tokens replace, possibly from
another program.

Padding rows (slot < 0) run from a zero window, as the references do, and write nothing; window loads are
masked, so whatever an unused slot holds (NaN included) never reaches an output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..pdl_triton import pdl_entry, pdl_launch
from ..triton_support import num_sms

MIN_BLOCK_C = 32
MAX_BLOCK_C = 128


@triton.jit
def _activate(out, SILU: tl.constexpr):
    if SILU:
        out = out * tl.sigmoid(out)
    return out


@triton.jit
def _update_seq(x_row, window, pos, ok, live, c, c_ok, stride_xt, stride_xc, stride_sj, W: tl.constexpr):
    """seq[c, pos] in fp32 for c [BLOCK_C] and pos [1, M] (masked by ok [1, M]): a window column or a token."""
    in_win = pos < W
    old = tl.load(window + pos * stride_sj, mask=live & ok & in_win & c_ok[:, None], other=0.0)
    new = tl.load(x_row + (pos - W) * stride_xt + c[:, None] * stride_xc, mask=ok & ~in_win & c_ok[:, None], other=0.0)
    return tl.where(in_win, old.to(tl.float32), new.to(tl.float32))


@triton.jit
def _update_kernel(
    x_ptr, w_ptr, bias_ptr, conv_ptr, slots_ptr, y_ptr,
    stride_xb, stride_xt, stride_xc,
    stride_wc, stride_wk,
    stride_ss, stride_sc, stride_sj,
    stride_yb, stride_yt,
    channels,
    WIDTH: tl.constexpr, STEPS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    W: tl.constexpr = WIDTH - 1
    KEEP: tl.constexpr = W + STEPS - 1  # columns written back: seq[:, 1:]
    row, cblock = tl.program_id(0), tl.program_id(1)
    row64 = row.to(tl.int64)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    live = slot >= 0
    c = cblock * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < channels
    x_row = x_ptr + row64 * stride_xb
    window = conv_ptr + tl.maximum(slot, 0) * stride_ss + c[:, None] * stride_sc  # [BLOCK_C, 1]

    t = tl.arange(0, BLOCK_T)[None, :]
    t_ok = t < STEPS
    acc = tl.zeros([BLOCK_C, BLOCK_T], tl.float32)
    for i in tl.static_range(WIDTH):
        w_i = tl.load(w_ptr + c * stride_wc + i * stride_wk, mask=c_ok, other=0.0).to(tl.float32)
        acc += _update_seq(x_row, window, t + i, t_ok, live, c, c_ok, stride_xt, stride_xc, stride_sj, W) * w_i[:, None]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[:, None]
    if KEEP > 0:  # the window's new columns read before y's store (y is a fresh tensor): the loads go out together
        j = tl.arange(0, BLOCK_J)[None, :]
        j_ok = j < KEEP
        kept = _update_seq(x_row, window, j + 1, j_ok, live, c, c_ok, stride_xt, stride_xc, stride_sj, W)
    acc = _activate(acc, SILU)
    tl.store(y_ptr + row64 * stride_yb + t * stride_yt + c[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=t_ok & c_ok[:, None])

    if KEEP > 0:
        tl.debug_barrier()  # every read of the window above happens before any store below
        tl.store(window + j * stride_sj, kept.to(conv_ptr.dtype.element_ty), mask=live & j_ok & c_ok[:, None])


@triton.jit
def _prefill_kernel(
    x_ptr, w_ptr, bias_ptr, conv_ptr, slots_ptr, init_ptr, cu_ptr, y_ptr,
    stride_xn, stride_xc,
    stride_wc, stride_wk,
    stride_ss, stride_sc, stride_sj,
    stride_yn,
    num_tokens, num_rows, channels,
    WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    W: tl.constexpr = WIDTH - 1
    tblock, cblock = tl.program_id(0), tl.program_id(1)
    n = tblock * BLOCK_T + tl.arange(0, BLOCK_T)
    n_ok = n < num_tokens
    c = cblock * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < channels

    # Row of token n: the last r in [0, B) with cu[r] <= n (empty rows share their offset with the next).
    lo = tl.zeros([BLOCK_T], tl.int32)
    hi = tl.full([BLOCK_T], num_rows, tl.int32)
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        right = tl.load(cu_ptr + mid, mask=n_ok, other=0) <= n
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    start = tl.load(cu_ptr + lo, mask=n_ok, other=0)
    slot = tl.load(slots_ptr + lo, mask=n_ok, other=-1).to(tl.int64)
    from_window = (slot >= 0) & (tl.load(init_ptr + lo, mask=n_ok, other=0) != 0)
    window = conv_ptr + tl.maximum(slot, 0)[:, None] * stride_ss + c[None, :] * stride_sc  # [BLOCK_T, BLOCK_C]

    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
    for i in tl.static_range(WIDTH):
        src = n.to(tl.int64) + (i - W)  # flat token of tap i, when it is in the row
        in_x = src >= start
        new = tl.load(x_ptr + src[:, None] * stride_xn + c[None, :] * stride_xc,
                      mask=(n_ok & in_x)[:, None] & c_ok[None, :], other=0.0)
        old = tl.load(window + (src - start + W)[:, None] * stride_sj,
                      mask=(n_ok & ~in_x & from_window)[:, None] & c_ok[None, :], other=0.0)
        w_i = tl.load(w_ptr + c * stride_wc + i * stride_wk, mask=c_ok, other=0.0).to(tl.float32)
        acc += tl.where(in_x[:, None], new.to(tl.float32), old.to(tl.float32)) * w_i[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    acc = _activate(acc, SILU)
    tl.store(y_ptr + n.to(tl.int64)[:, None] * stride_yn + c[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=n_ok[:, None] & c_ok[None, :])


@triton.jit
def _prefill_window_kernel(
    x_ptr, conv_ptr, slots_ptr, init_ptr, cu_ptr,
    stride_xn, stride_xc,
    stride_ss, stride_sc, stride_sj,
    channels,
    W: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
):
    """conv[slot, :, :W] = the row's last W inputs (cat(window or zeros, x_row)[:, -W:])."""
    pdl_entry(PDL)
    row, cblock = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    live = slot >= 0
    from_window = live & (tl.load(init_ptr + row) != 0)
    start = tl.load(cu_ptr + row).to(tl.int64)
    length = tl.load(cu_ptr + row + 1).to(tl.int64) - start
    c = cblock * BLOCK_C + tl.arange(0, BLOCK_C)[:, None]
    c_ok = c < channels
    j = tl.arange(0, BLOCK_W)[None, :]
    j_ok = j < W
    pos = length - W + j  # position in the row's inputs; negative: still in the old window
    in_x = pos >= 0
    window = conv_ptr + tl.maximum(slot, 0) * stride_ss + c * stride_sc
    new = tl.load(x_ptr + (start + pos) * stride_xn + c * stride_xc, mask=j_ok & in_x & c_ok, other=0.0)
    old = tl.load(window + (pos + W) * stride_sj, mask=from_window & j_ok & ~in_x & c_ok, other=0.0)
    last = tl.where(in_x, new.to(tl.float32), old.to(tl.float32))
    tl.debug_barrier()  # every read of the window above happens before any store below
    tl.store(window + j * stride_sj, last.to(conv_ptr.dtype.element_ty), mask=live & j_ok & c_ok)



def _block_c(channels: int, programs_per_block: int, num_sms: int) -> int:
    """Channels per program: MAX_BLOCK_C, halved (not below MIN_BLOCK_C) until there are two programs per SM."""
    block_c = min(MAX_BLOCK_C, max(MIN_BLOCK_C, triton.next_power_of_2(channels)))
    while block_c > MIN_BLOCK_C and programs_per_block * triton.cdiv(channels, block_c) < 2 * num_sms:
        block_c //= 2
    return block_c


def _silu(activation: str | None) -> bool:
    if activation not in (None, "silu"):
        raise ValueError(f"unknown activation {activation!r}")
    return activation == "silu"


def causal_conv1d_update_triton(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    conv: Tensor,
    slots: Tensor,
    activation: str | None = None,
    block_c: int | None = None,
) -> Tensor:
    """One Triton launch; same arguments and result as `causal_conv1d_update`.

    x: [B, T, C]; weight: [C, K]; bias: [C] or None; conv: [S, C, W + k] with W + k >= W + T - 1 (written
    in place); slots: [B] (negative = padding). Returns y: [B, T, C] in x's dtype. `block_c` (channels per
    program, a power of two) defaults to a choice from the shapes; it does not change the result.
    """
    batch, steps, channels = x.shape
    width = weight.shape[1]
    w = width - 1
    if w + steps - 1 > conv.shape[-1]:
        raise ValueError(f"T={steps} needs a conv role of width >= {w + steps - 1}, got {conv.shape[-1]}")
    silu = _silu(activation)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if batch == 0 or steps == 0 or channels == 0:
        return y
    if block_c is None:
        block_c = _block_c(channels, batch, num_sms(x.device))
    slots = slots.contiguous()
    bias_arg = bias.contiguous() if bias is not None else slots  # unused when absent
    _update_kernel[(batch, triton.cdiv(channels, block_c))](
        x, weight, bias_arg, conv, slots, y,
        x.stride(0), x.stride(1), x.stride(2),
        weight.stride(0), weight.stride(1),
        conv.stride(0), conv.stride(1), conv.stride(2),
        y.stride(0), y.stride(1),
        channels,
        WIDTH=width, STEPS=steps, BLOCK_C=block_c, BLOCK_T=triton.next_power_of_2(steps),
        BLOCK_J=triton.next_power_of_2(max(1, w + steps - 1)), HAS_BIAS=bias is not None, SILU=silu,
        num_warps=4, **pdl_launch(x),
    )
    return y


def causal_conv1d_prefill_triton(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    conv: Tensor,
    slots: Tensor,
    has_initial: Tensor,
    cu_seqlens: Tensor,
    activation: str | None = None,
    block_t: int = 32,
    block_c: int | None = None,
) -> Tensor:
    """Two Triton launches; same arguments and result as `causal_conv1d_prefill`.

    x: [N, C]; weight: [C, K]; bias: [C] or None; conv: [S, C, W + k] (written in place); slots: [B]
    (negative = padding); has_initial: [B] bool; cu_seqlens: [B + 1] with cu_seqlens[0] = 0 and
    cu_seqlens[B] = N (read on the device only). Returns y: [N, C] in x's dtype. `block_t` (tokens per
    program) and `block_c` (channels per program), powers of two, do not change the result.
    """
    num_tokens, channels = x.shape
    width = weight.shape[1]
    w = width - 1
    batch = slots.shape[0]
    silu = _silu(activation)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if batch == 0 or channels == 0:
        return y
    slots = slots.contiguous()
    has_initial = has_initial.to(device=x.device, dtype=torch.int8).contiguous()
    cu = cu_seqlens.to(device=x.device, dtype=torch.int32).contiguous()
    token_blocks = triton.cdiv(num_tokens, block_t)
    if block_c is None:
        block_c = _block_c(channels, max(token_blocks, batch), num_sms(x.device))
    strides = (conv.stride(0), conv.stride(1), conv.stride(2))
    if num_tokens:
        bias_arg = bias.contiguous() if bias is not None else slots  # unused when absent
        _prefill_kernel[(token_blocks, triton.cdiv(channels, block_c))](
            x, weight, bias_arg, conv, slots, has_initial, cu, y,
            x.stride(0), x.stride(1),
            weight.stride(0), weight.stride(1),
            *strides,
            y.stride(0),
            num_tokens, batch, channels,
            WIDTH=width, BLOCK_T=block_t, BLOCK_C=block_c, SEARCH_STEPS=max(0, (batch - 1).bit_length()),
            HAS_BIAS=bias is not None, SILU=silu,
            num_warps=4, **pdl_launch(x),
        )
    if w > 0:
        _prefill_window_kernel[(batch, triton.cdiv(channels, block_c))](
            x, conv, slots, has_initial, cu,
            x.stride(0), x.stride(1),
            *strides,
            channels,
            W=w, BLOCK_W=triton.next_power_of_2(w), BLOCK_C=block_c,
            num_warps=4, **pdl_launch(x),
        )
    return y
