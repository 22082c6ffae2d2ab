"""The host tier: flat byte records (the planner owns their ids), one per host slot and one per host page, pinned when CUDA is used."""
from __future__ import annotations

import torch

from .roles import RecordLayout, RoleSpec


class HostTier:
    """`slot_records [num_slots, slot_layout.nbytes]` and `page_records [num_pages, page_layout.nbytes]`.

    A host slot holds only the live bytes of a device slot (one half of a double-buffered role).
    """

    def __init__(
        self,
        slot_roles: list[RoleSpec],
        page_roles: list[RoleSpec],
        num_slots: int,
        num_pages: int,
        pin: bool,
    ) -> None:
        self.slot_layout = RecordLayout.of(slot_roles)
        self.page_layout = RecordLayout.of(page_roles)
        self.slot_records = torch.zeros(num_slots, self.slot_layout.nbytes, dtype=torch.uint8, pin_memory=pin)
        self.page_records = torch.zeros(num_pages, self.page_layout.nbytes, dtype=torch.uint8, pin_memory=pin)

    @staticmethod
    def counts_for(
        budget: int, slot_roles: list[RoleSpec], page_roles: list[RoleSpec], slot_share: float,
        num_slots: int | None = None,
    ) -> tuple[int, int]:
        """Split a byte budget into host slots and pages: `num_slots` slots, or `slot_share` of the bytes."""
        slot_bytes = RecordLayout.of(slot_roles).nbytes
        page_bytes = RecordLayout.of(page_roles).nbytes
        if num_slots is None:
            num_slots = int(budget * slot_share) // slot_bytes
        num_slots = min(num_slots, budget // slot_bytes)
        num_pages = (budget - num_slots * slot_bytes) // page_bytes
        return num_slots, num_pages
