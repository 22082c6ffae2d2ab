"""Causal depthwise conv1d over slot windows: the Triton kernels on CUDA (`triton_conv.py`), else
vectorized torch (no per-row Python loops).

Same contracts as `naive.py`. Prefill gathers, for each token, its K inputs from one table that
stacks the flat tokens, every row's initial window and a zero row; the update unfolds
cat(window, x) per row. `shift_conv_window` (the accept rule after a verify step) has no reference: it is
one gather.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridcache.ops.slot_io import put_rows, take_rows
from hybridcache.ops.triton_support import runs_triton


def _activate(out: Tensor, activation: str | None) -> Tensor:
    if activation is None:
        return out
    if activation == "silu":
        return F.silu(out)
    raise ValueError(f"unknown activation {activation!r}")


def causal_conv1d_prefill(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    conv: Tensor,
    slots: Tensor,
    has_initial: Tensor,
    cu_seqlens: Tensor,
    activation: str | None = None,
) -> Tensor:
    """See `causal_conv1d_prefill_ref`. x: [N, C]; conv: [S, C, W + k]. Returns [N, C]."""
    if runs_triton(x):
        from hybridcache.ops.conv1d.triton_conv import causal_conv1d_prefill_triton

        return causal_conv1d_prefill_triton(x, weight, bias, conv, slots, has_initial, cu_seqlens, activation)
    return causal_conv1d_prefill_torch(x, weight, bias, conv, slots, has_initial, cu_seqlens, activation)


def causal_conv1d_prefill_torch(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    conv: Tensor,
    slots: Tensor,
    has_initial: Tensor,
    cu_seqlens: Tensor,
    activation: str | None = None,
) -> Tensor:
    """`causal_conv1d_prefill` in torch ops on any device (one gather from a table, see the module docstring)."""
    num_tokens, channels = x.shape
    width = weight.shape[1]
    w = width - 1
    batch = slots.shape[0]
    device = x.device
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    lens = cu[1:] - cu[:-1]
    valid = slots >= 0
    windows = take_rows(conv[:, :, :w], slots, valid & has_initial.to(device))  # [B, C, W]
    # table rows: [0, N) tokens, [N, N + B*W) windows (row b, age j at N + b*W + j), N + B*W zero row
    table = torch.cat(
        [x.float(), windows.float().transpose(1, 2).reshape(batch * w, channels), x.new_zeros(1, channels).float()]
    )
    rows = torch.repeat_interleave(torch.arange(batch, device=device), lens, output_size=num_tokens)
    local = torch.arange(num_tokens, device=device) - cu[rows]  # position of each token in its row

    def source(row: Tensor, pos: Tensor) -> Tensor:
        """Table index of input `pos` of `row` (pos in [-W, len)); pos < -W cannot occur."""
        in_x = pos >= 0
        return torch.where(in_x, cu[row] + pos.clamp_min(0), num_tokens + row * w + (pos + w).clamp_min(0))

    taps = torch.arange(-w, 1, device=device)  # [K]: oldest tap first
    idx = source(rows[:, None], local[:, None] + taps)  # [N, K]
    out = (table[idx] * weight.float().T).sum(1)  # [N, K, C] -> [N, C]
    if bias is not None:
        out = out + bias.float()
    y = _activate(out, activation).to(x.dtype)
    if w > 0:
        ages = torch.arange(w, device=device)
        pos = lens[:, None] - w + ages  # [B, W]: the last W inputs of each row
        last = table[source(torch.arange(batch, device=device)[:, None], pos)]  # [B, W, C]
        put_rows(conv[:, :, :w], (slots,), last.transpose(1, 2), valid)
    return y


def causal_conv1d_update(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    conv: Tensor,
    slots: Tensor,
    activation: str | None = None,
) -> Tensor:
    """See `causal_conv1d_update_ref`. x: [B, T, C]; conv: [S, C, W + k]. Returns [B, T, C]."""
    if runs_triton(x):
        from hybridcache.ops.conv1d.triton_conv import causal_conv1d_update_triton

        return causal_conv1d_update_triton(x, weight, bias, conv, slots, activation)
    return causal_conv1d_update_torch(x, weight, bias, conv, slots, activation)


def causal_conv1d_update_torch(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    conv: Tensor,
    slots: Tensor,
    activation: str | None = None,
) -> Tensor:
    """`causal_conv1d_update` in torch ops on any device (unfold cat(window, x) per row)."""
    width = weight.shape[1]
    w = width - 1
    steps = x.shape[1]
    if w + steps - 1 > conv.shape[-1]:
        raise ValueError(f"T={steps} needs a conv role of width >= {w + steps - 1}, got {conv.shape[-1]}")
    valid = slots >= 0
    window = take_rows(conv[:, :, :w], slots, valid)  # [B, C, W]
    seq = torch.cat([window.float(), x.float().transpose(1, 2)], dim=2)  # [B, C, W + T]
    out = (seq.unfold(2, width, 1) * weight.float()[:, None, :]).sum(-1)  # [B, C, T]
    if bias is not None:
        out = out + bias.float()[:, None]
    y = _activate(out, activation).transpose(1, 2).to(x.dtype)
    if w + steps - 1 > 0:
        put_rows(conv[:, :, : w + steps - 1], (slots,), seq[:, :, 1:], valid)
    return y


def shift_conv_window(conv: Tensor, slots: Tensor, num_valid: Tensor, width: int,
                      num_tokens: Tensor | int | None = None) -> None:
    """The conv window's accept rule after a verify step (every recurrent layer kind with a short conv).

    conv: [L, S, C, W + k] (every layer of a module; written in place), holding `cat(window, x)[..., 1:]`
    after `causal_conv1d_update`; slots: [n] live slots (no padding rows); num_valid: [n] (1..T); width = W.
    Keeps the window that the `v` valid tokens leave: `conv[..., :W] = conv[..., v - 1 : v - 1 + W]`.
    `num_tokens` (T, as the accept hooks get it): a step of one token a row leaves v = 1 everywhere, the
    identity, and launches nothing.
    """
    if conv.shape[-1] == width or width == 0 or (isinstance(num_tokens, int) and num_tokens == 1):
        return
    if runs_triton(conv):
        from hybridcache.ops.conv1d.triton_shift import shift_conv_window_triton

        return shift_conv_window_triton(conv, slots, num_valid, width)
    if not conv.is_cuda:  # on the host a mask costs no sync: drop the rows with v == 1 (an identity for them)
        moved = num_valid > 1
        slots, num_valid = slots[moved], num_valid[moved]
        if slots.numel() == 0:
            return
    rows = conv[:, slots]  # [L, n, C, W + k]
    start = (num_valid.long() - 1).clamp(min=0)
    idx = start[:, None] + torch.arange(width, device=conv.device)  # [n, W]
    idx = idx[None, :, None, :].expand(rows.shape[0], rows.shape[1], rows.shape[2], width)
    conv[:, slots, :, :width] = rows.gather(-1, idx)
