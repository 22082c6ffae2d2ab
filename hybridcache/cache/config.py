"""Validated configuration of the cache manager."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import LayoutError


@dataclass(frozen=True)
class CacheConfig:
    """Byte budgets and geometry.

    `num_slots` device slots for requests (beside `num_dummy_slots` permanent ones); the rest of
    `device_bytes` becomes pages. `None` gives slots `slot_share` of the budget. The host tier keeps the
    device's slot/page byte split unless `host_num_slots` fixes its slot count.
    """

    device_bytes: int
    host_bytes: int = 0
    page_size: int = 16
    num_slots: int | None = None
    slot_share: float = 0.5
    num_dummy_slots: int = 1
    host_num_slots: int | None = None
    device: str = "cpu"
    snapshot_interval: int = 0  # tokens between prefix-cache snapshots (a multiple of page_size); 0: prefix caching off
    num_snapshot_slots: int = 0  # slot rows (every role) that hold prefix-cache snapshots

    def __post_init__(self) -> None:
        if self.device_bytes <= 0:
            raise LayoutError(f"device_bytes must be positive, got {self.device_bytes}")
        if self.host_bytes < 0:
            raise LayoutError(f"host_bytes must be >= 0, got {self.host_bytes}")
        if self.page_size < 1:
            raise LayoutError(f"page_size must be >= 1, got {self.page_size}")
        if self.num_slots is not None and self.num_slots < 1:
            raise LayoutError(f"num_slots must be >= 1, got {self.num_slots}")
        if not 0.0 < self.slot_share < 1.0:
            raise LayoutError(f"slot_share must be in (0, 1), got {self.slot_share}")
        if self.host_num_slots is not None and self.host_num_slots < 0:
            raise LayoutError(f"host_num_slots must be >= 0, got {self.host_num_slots}")
        if self.num_dummy_slots < 0:
            raise LayoutError(f"num_dummy_slots must be >= 0, got {self.num_dummy_slots}")
        if self.snapshot_interval < 0 or self.snapshot_interval % self.page_size:
            raise LayoutError(f"snapshot_interval must be a multiple of page_size {self.page_size}, got {self.snapshot_interval}")
        if self.num_snapshot_slots < 0 or (self.snapshot_interval and self.num_snapshot_slots < 1):
            raise LayoutError(f"prefix caching needs num_snapshot_slots >= 1, got {self.num_snapshot_slots}")
        torch.device(self.device)  # raises on a malformed device string
