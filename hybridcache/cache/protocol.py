"""The hook protocol a state module (`hybridcache.states`) implements; the manager is handed them."""
from __future__ import annotations

from typing import Mapping

import torch

from .roles import RoleSpec


class StateModule:
    """Declares the slot roles of one layer kind and keeps their per-step bookkeeping.

    `roles()` names are local (`"ssm"`); the manager prefixes them with `name` (`"mamba2.ssm"`), and hands
    the hooks a mapping from the local names to the device tensors `[layers, slots, ...]`.
    """

    name: str = "state"

    def roles(self) -> list[RoleSpec]:
        raise NotImplementedError

    def on_context_start(self, tensors: Mapping[str, torch.Tensor], slots: torch.Tensor) -> None:
        """A request starts (or restarts) from nothing in `slots [n]`: zero every role."""
        for t in tensors.values():
            t[:, slots] = 0

    def on_accept(
        self,
        tensors: Mapping[str, torch.Tensor],
        slots: torch.Tensor,
        num_tokens: torch.Tensor,
        num_valid: torch.Tensor,
    ) -> None:
        """After a verify step of `num_tokens [n]` tokens of which `num_valid [n]` are valid."""


class PageRoles:
    """Declares the page roles (attention K/V) of a model; no hooks: pages have no bookkeeping."""

    name: str = "attn"

    def roles(self) -> list[RoleSpec]:
        raise NotImplementedError
