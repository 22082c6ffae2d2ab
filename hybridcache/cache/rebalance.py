"""Rebalance: re-carve the device arena into another slot/page split while requests are live.

Every live request's slot rows (every role, replay history included) and its committed pages go through
a temporary pinned buffer (live bytes only), the arena is re-carved, and they come back compacted.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .errors import BudgetTooSmallError, OutOfDeviceMemoryError
from .host_tier import HostTier
from .id_pool import IdPool
from .tiering import copy_in, copy_out

if TYPE_CHECKING:
    from .manager import HybridCacheManager


def fits(mgr: "HybridCacheManager", num_slots: int) -> bool:
    """Whether the live requests fit `num_slots` slots and the pages left beside them."""
    dummies, budget = mgr.config.num_dummy_slots, mgr.config.device_bytes
    if num_slots < 1 or mgr.sizing.bytes_for(num_slots + dummies, 0) > budget:
        return False
    live = [e for e in mgr._entries.values() if e.on_device]
    pages = sum(mgr._live_pages(e) for e in live)
    return len(live) <= num_slots and pages <= mgr.sizing.split(budget, num_slots + dummies)


def recarve(mgr: "HybridCacheManager", num_slots: int) -> int:
    """Move the live state to a carving of `num_slots` slots (plus dummies) and the pages that fit.

    Raises (changing nothing) when the split cannot hold the live requests. Returns bytes moved each way.
    """
    dummies = mgr.config.num_dummy_slots
    if num_slots < 1:
        raise BudgetTooSmallError(f"num_slots must be >= 1, got {num_slots}")
    num_pages = mgr.sizing.split(mgr.config.device_bytes, num_slots + dummies)
    live = [e for e in mgr._entries.values() if e.on_device]
    live_pages = [e.pages[: mgr._live_pages(e)] for e in live]
    flat_pages = [p for ps in live_pages for p in ps]
    if len(live) > num_slots or len(flat_pages) > num_pages:
        raise OutOfDeviceMemoryError(
            f"{len(live)} live requests with {len(flat_pages)} pages do not fit {num_slots} slots and {num_pages} pages"
        )
    copies, tier = mgr.copies, mgr.device_tier
    saved = HostTier(mgr.slot_roles, mgr.page_roles, len(live), len(flat_pages), pin=copies.cuda)
    slot_order, page_order = list(range(len(live))), list(range(len(flat_pages)))
    moved = copy_out(mgr, saved, [e.slot for e in live], flat_pages, slot_order, page_order)
    copies.synchronize()
    tier.carve(num_slots + dummies, num_pages)
    mgr.slot_pool = IdPool(num_slots + dummies, permanent=dummies)
    mgr.page_pool = IdPool(num_pages)
    new_slots = mgr.slot_pool.allocate(len(live))
    new_pages = [mgr.page_pool.allocate(len(ps)) for ps in live_pages]
    copy_in(mgr, saved, new_slots, [p for ps in new_pages for p in ps], slot_order, page_order)
    for e, slot, pages in zip(live, new_slots, new_pages):
        e.slot, e.pages = slot, pages
    if dummies:  # their rows are scratch: zero them so a padding row never reads NaN bit patterns
        tier.zero_slots(torch.arange(dummies, device=mgr.device))
    copies.synchronize()
    return moved
