"""The device tier: one byte arena carved into role tensors `[layers, rows, *shape]`."""
from __future__ import annotations

import torch

from .roles import RoleSpec, align


class DeviceTier:
    """Role tensors for `num_slots` slots and `num_pages` pages, all views of one arena.

    Re-carving (rebalance) keeps the arena and hands out new views; the caller moves live rows.
    """

    def __init__(
        self,
        slot_roles: list[RoleSpec],
        page_roles: list[RoleSpec],
        arena_bytes: int,
        device: torch.device,
    ) -> None:
        self.slot_roles = slot_roles
        self.page_roles = page_roles
        self.device = device
        self.arena = torch.zeros(arena_bytes, dtype=torch.uint8, device=device)
        self.slots: dict[str, torch.Tensor] = {}
        self.pages: dict[str, torch.Tensor] = {}
        self.by_module: dict[str, dict[str, torch.Tensor]] = {}
        self.num_slots = 0
        self.num_pages = 0
        self.generation = 0  # counts carvings: role views (and what captured them) from an older one are stale

    def carve(self, num_slots: int, num_pages: int) -> None:
        """Lay role tensors over the arena for the given counts (contents are not preserved)."""
        cursor = 0
        views: list[dict[str, torch.Tensor]] = [{}, {}]
        for out, roles, rows in ((views[0], self.slot_roles, num_slots), (views[1], self.page_roles, num_pages)):
            for role in roles:
                nbytes = role.row_bytes * rows
                if cursor + nbytes > self.arena.numel():
                    raise ValueError(f"{num_slots} slots + {num_pages} pages do not fit the arena")
                flat = self.arena[cursor : cursor + nbytes]
                out[role.name] = flat.view(role.dtype).view(role.layers, rows, *role.shape)
                cursor += align(nbytes)
        self.slots, self.pages = views
        self.by_module = {}
        for name, t in self.slots.items():  # "mamba2.ssm" -> by_module["mamba2"]["ssm"]
            module, role = name.split(".", 1)
            self.by_module.setdefault(module, {})[role] = t
        self.num_slots, self.num_pages = num_slots, num_pages
        self.generation += 1

    def zero_slots(self, slots: torch.Tensor) -> None:
        """Zero every role of the given slots `[n]` (int64, on the device)."""
        for t in self.slots.values():
            t[:, slots] = 0
