"""Bookkeeping shared by the replay layer kinds (Mamba2, GDN): PNAT / buffer index and the conv window."""
from __future__ import annotations

from typing import Mapping

import torch

from ..cache.errors import LayoutError
from ..cache.protocol import StateModule


def history_length(num_draft_tokens: int, hist: int | None) -> int:
    """HIST = max(16, T) unless given; a given HIST below T cannot hold one verify step."""
    tokens = num_draft_tokens + 1
    if hist is None:
        return max(16, tokens)
    if hist < tokens:
        raise LayoutError(f"{num_draft_tokens} draft tokens need a replay history of >= {tokens}; HIST is {hist}")
    return hist


def accept_replay(
    pnat: torch.Tensor, buf_idx: torch.Tensor, slots: torch.Tensor, num_tokens: torch.Tensor,
    num_valid: torch.Tensor, hist: int,
) -> None:
    """pnat, buf_idx `[1, S]`; slots, num_tokens, num_valid `[n]`.

    The step folded (and wrote the other buffer) when `pnat + T > HIST`: flip and restart at `v`;
    otherwise the valid tokens were appended: `pnat += v`.
    """
    p = pnat[0, slots]
    folded = p + num_tokens > hist
    pnat[0, slots] = torch.where(folded, num_valid, p + num_valid).to(pnat.dtype)
    buf_idx[0, slots] = torch.where(folded, 1 - buf_idx[0, slots], buf_idx[0, slots]).to(buf_idx.dtype)


def shift_conv_window(conv: torch.Tensor, slots: torch.Tensor, num_valid: torch.Tensor, width: int) -> None:
    """conv `[L, S, C, W + k]` after a verify step holds `cat(window, x)[..., 1:]`; keep the window that
    the `v` valid tokens leave: `conv[..., :W] = conv[..., v - 1 : v - 1 + W]`."""
    if conv.shape[-1] == width or width == 0:
        return
    rows = conv[:, slots]  # [L, n, C, W + k]
    start = (num_valid.long() - 1).clamp(min=0)
    idx = start[:, None] + torch.arange(width, device=conv.device)  # [n, W]
    idx = idx[None, :, None, :].expand(rows.shape[0], rows.shape[1], rows.shape[2], width)
    conv[:, slots, :, :width] = rows.gather(-1, idx)


class ReplayState(StateModule):
    """A layer kind with a double-buffered replay history (Mamba2, GDN): after a verify step the PNAT /
    buffer-index rule and the conv-window shift. Subclasses set `hist`, `conv_kernel`, `num_draft_tokens`."""

    hist: int
    conv_kernel: int
    num_draft_tokens: int

    @property
    def replay(self) -> bool:
        return self.num_draft_tokens > 0

    def on_accept(
        self, tensors: Mapping[str, torch.Tensor], slots: torch.Tensor,
        num_tokens: torch.Tensor, num_valid: torch.Tensor,
    ) -> None:
        if not self.replay:
            return
        accept_replay(tensors["pnat"], tensors["buf_idx"], slots, num_tokens, num_valid, self.hist)
        shift_conv_window(tensors["conv"], slots, num_valid, self.conv_kernel - 1)
