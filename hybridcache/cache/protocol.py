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

    @property
    def needs_accept(self) -> bool:
        """Whether `on_accept` does anything (a store skips uploading the step's counts when no module's does)."""
        return False

    def on_accept(
        self,
        tensors: Mapping[str, torch.Tensor],
        slots: torch.Tensor,
        num_tokens: torch.Tensor | int,
        num_valid: torch.Tensor,
    ) -> None:
        """After a verify step of `num_tokens [n]` tokens (an int: every row fed that many) of which
        `num_valid [n]` are valid."""

    def snapshot_roles(self) -> tuple[str, ...]:
        """The roles a request restarts from (a prefix-cache snapshot holds these; restoring zeroes the
        rest): every role unless the module says less."""
        return tuple(r.name for r in self.roles())

    def save_snapshot(self, tensors: Mapping[str, torch.Tensor], slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write the committed state of request `slots [n]` into snapshot slot `rows [n]`, in the form a
        context step starts from (speculative history folded in); the request's own slot is not changed."""
        for name in self.snapshot_roles():
            tensors[name][:, rows] = tensors[name][:, slots]

    def restore_snapshot(self, tensors: Mapping[str, torch.Tensor], rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Copy snapshot `rows [n]` into request `slots [n]`, already zeroed."""
        for name in self.snapshot_roles():
            tensors[name][:, slots] = tensors[name][:, rows]


class PageRoles:
    """Declares the page roles (attention K/V) of a model; no hooks: pages have no bookkeeping."""

    name: str = "attn"

    def roles(self) -> list[RoleSpec]:
        raise NotImplementedError
