"""Kimi Delta Attention layers: conv window, state after the last verified token, pending-draft caches."""
from __future__ import annotations

from typing import Mapping

import torch

from ..cache.errors import LayoutError
from ..cache.protocol import StateModule
from ..cache.roles import RoleSpec
from ..ops.conv1d import shift_conv_window
from ..ops.kda.accept import kda_accept
from ..ops.kda.verify import kda_effective_state
from .split import REPLICATED, HeadSplit, heads


class KDAState(StateModule):
    """Roles of `num_layers` KDA layers, H heads of width D (per slot; docs/layouts.md):

    conv `[3*H*D, W + k]` over the q/k/v sections, ssm `[H, D, D]` fp32; with speculation also pend_k,
    pend_g `[k, H, D]` (fp32: normalised keys, log-decay), pend_v `[k, H, D]`, pend_beta `[k, H]` fp32 and pend_n
    (one layer).
    The short conv runs over three sections of equal width; unequal q/k/v widths are refused.
    """

    name = "kda"

    def __init__(
        self, num_layers: int, num_heads: int, head_dim: int, conv_kernel: int,
        sections: tuple[int, int, int] | None = None, dtype: torch.dtype = torch.float32,
        num_draft_tokens: int = 0,
    ) -> None:
        width = num_heads * head_dim
        sections = sections or (width, width, width)
        if len(set(sections)) != 1 or sections[0] != width:
            raise LayoutError(
                f"kda: q/k/v section widths must all equal heads*head_dim = {width}; got {tuple(sections)}"
            )
        if conv_kernel < 1 or num_draft_tokens < 0:
            raise LayoutError(f"kda: conv_kernel {conv_kernel} / draft tokens {num_draft_tokens} invalid")
        self.num_layers, self.H, self.D, self.conv_kernel = num_layers, num_heads, head_dim, conv_kernel
        self.dtype, self.num_draft_tokens = dtype, num_draft_tokens
        self.conv_dim = 3 * width

    @property
    def replay(self) -> bool:
        return self.num_draft_tokens > 0

    def roles(self) -> list[RoleSpec]:
        L, H, D, k = self.num_layers, self.H, self.D, self.num_draft_tokens
        roles = [
            RoleSpec("conv", L, (self.conv_dim, self.conv_kernel - 1 + k), self.dtype),
            RoleSpec("ssm", L, (H, D, D), torch.float32),
        ]
        if self.replay:
            roles += [
                RoleSpec("pend_k", L, (k, H, D), torch.float32),  # normalised in fp32: kept so, as decode uses them
                RoleSpec("pend_g", L, (k, H, D), torch.float32),
                RoleSpec("pend_v", L, (k, H, D), self.dtype),
                RoleSpec("pend_beta", L, (k, H), torch.float32),
                RoleSpec("pend_n", 1, (), torch.int32),
            ]
        return roles

    def head_splits(self) -> dict[str, HeadSplit]:
        """conv channels are q, k and v (H heads of D each); the state and pending drafts split by head."""
        H, D = self.H, self.D
        splits = {"conv": HeadSplit(0, ((H, D),) * 3), "ssm": heads(H)}
        if self.replay:  # live shapes: pend_k / g / v [k, H, D], pend_beta [k, H]
            splits.update(pend_k=heads(H, 1), pend_g=heads(H, 1), pend_v=heads(H, 1), pend_beta=heads(H, 1),
                          pend_n=REPLICATED)
        return splits

    @property
    def needs_accept(self) -> bool:
        return self.replay

    def on_accept(
        self, tensors: Mapping[str, torch.Tensor], slots: torch.Tensor,
        num_tokens: torch.Tensor | int, num_valid: torch.Tensor,
    ) -> None:
        if not self.replay:
            return
        kda_accept(tensors["pend_n"][0], slots, num_valid)
        shift_conv_window(tensors["conv"], slots, num_valid, self.conv_kernel - 1, num_tokens)

    def snapshot_roles(self) -> tuple[str, ...]:
        return ("conv", "ssm")

    def save_snapshot(self, tensors: Mapping[str, torch.Tensor], slots: torch.Tensor, rows: torch.Tensor) -> None:
        """The conv window and the state with the accepted pending drafts replayed into it."""
        t = tensors
        t["conv"][:, rows] = t["conv"][:, slots]
        if not self.replay:
            t["ssm"][:, rows] = t["ssm"][:, slots]
            return
        for layer in range(t["ssm"].shape[0]):
            t["ssm"][layer, rows] = kda_effective_state(t["ssm"][layer], t["pend_k"][layer], t["pend_g"][layer],
                                                        t["pend_v"][layer], t["pend_beta"][layer], t["pend_n"][0], slots)
