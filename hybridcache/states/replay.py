"""Bookkeeping shared by the replay layer kinds (Mamba2, GDN): PNAT / buffer index and the conv window.

The rules themselves are pure ops (`ops.replay_accept`, `ops.conv1d.shift_conv_window`); this module
applies them to the pool's roles."""
from __future__ import annotations

from typing import Mapping

import torch

from ..cache.errors import LayoutError
from ..cache.protocol import StateModule
from ..ops.conv1d import shift_conv_window
from ..ops.replay_accept import replay_accept


def history_length(num_draft_tokens: int, hist: int | None) -> int:
    """HIST = max(16, T) unless given; a given HIST below T cannot hold one verify step."""
    tokens = num_draft_tokens + 1
    if hist is None:
        return max(16, tokens)
    if hist < tokens:
        raise LayoutError(f"{num_draft_tokens} draft tokens need a replay history of >= {tokens}; HIST is {hist}")
    return hist


class ReplayState(StateModule):
    """A layer kind with a double-buffered replay history (Mamba2, GDN): after a verify step the PNAT /
    buffer-index rule and the conv-window shift. Subclasses set `hist`, `conv_kernel`, `num_draft_tokens`."""

    hist: int
    conv_kernel: int
    num_draft_tokens: int

    @property
    def replay(self) -> bool:
        return self.num_draft_tokens > 0

    @property
    def needs_accept(self) -> bool:
        return self.replay

    def snapshot_roles(self) -> tuple[str, ...]:
        return ("conv", "ssm")

    def effective_state(self, tensors: Mapping[str, torch.Tensor], layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s checkpoint with the PNAT accepted history tokens folded in, `[n, ...]` fp32."""
        raise NotImplementedError

    def save_snapshot(self, tensors: Mapping[str, torch.Tensor], slots: torch.Tensor, rows: torch.Tensor) -> None:
        """The conv window as it is (its first W columns are the valid window after any accept) and the
        checkpoint with the replay history folded in, so a context step can start from it."""
        tensors["conv"][:, rows] = tensors["conv"][:, slots]
        if not self.replay:
            tensors["ssm"][:, rows] = tensors["ssm"][:, slots]
            return
        for layer in range(tensors["ssm"].shape[0]):
            tensors["ssm"][layer, rows] = self.effective_state(tensors, layer, slots)

    def on_accept(
        self, tensors: Mapping[str, torch.Tensor], slots: torch.Tensor,
        num_tokens: torch.Tensor | int, num_valid: torch.Tensor,
    ) -> None:
        if not self.replay:
            return
        replay_accept(tensors["pnat"][0], tensors["buf_idx"][0], slots, num_tokens, num_valid, self.hist)
        shift_conv_window(tensors["conv"], slots, num_valid, self.conv_kernel - 1, num_tokens)
