"""Moving requests between the tiers: the pool bookkeeping around the copy engine."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .entries import Entry, Status
from .errors import HostTierFullError, OutOfDeviceMemoryError
from .host_tier import HostTier

if TYPE_CHECKING:
    from .manager import HybridCacheManager


def copy_out(mgr: "HybridCacheManager", host: HostTier, slots: list[int], pages: list[int],
             host_slots: list[int], host_pages: list[int]) -> int:
    """Device slot rows and pages -> host records (live bytes only); returns the bytes moved."""
    tier, copies = mgr.device_tier, mgr.copies
    return (copies.to_host(mgr.slot_roles, tier.slots, slots, host.slot_layout, host.slot_records, host_slots)
            + copies.to_host(mgr.page_roles, tier.pages, pages, host.page_layout, host.page_records, host_pages))


def copy_in(mgr: "HybridCacheManager", host: HostTier, slots: list[int], pages: list[int],
            host_slots: list[int], host_pages: list[int]) -> int:
    """Host records -> device slot rows and pages; returns the bytes moved."""
    tier, copies = mgr.device_tier, mgr.copies
    return (copies.to_device(mgr.slot_roles, tier.slots, slots, host.slot_layout, host.slot_records, host_slots)
            + copies.to_device(mgr.page_roles, tier.pages, pages, host.page_layout, host.page_records, host_pages))


def to_host(mgr: "HybridCacheManager", entries: list[Entry]) -> int:
    """Suspend generating `entries`: their live pages and slot rows go to the host tier, the device ones
    are released. Raises HostTierFullError (changing nothing) when the host tier cannot hold them all."""
    live = [e.pages[: mgr._live_pages(e)] for e in entries]
    host = mgr.host_tier
    need = sum(map(len, live))
    if len(entries) > host.slot_pool.num_free or need > host.page_pool.num_free:
        raise HostTierFullError(
            f"host tier has {host.slot_pool.num_free} slots and {host.page_pool.num_free} pages free; "
            f"suspending needs {len(entries)} and {need}"
        )
    host_slots = host.slot_pool.allocate(len(entries))
    host_pages = [host.page_pool.allocate(len(p)) for p in live]
    moved = copy_out(mgr, host, [e.slot for e in entries], [p for ps in live for p in ps], host_slots,
                     [p for ps in host_pages for p in ps])
    for e, hs, hp in zip(entries, host_slots, host_pages):
        mgr.slot_pool.release([e.slot])
        mgr.page_pool.release(e.pages)
        e.slot, e.pages, e.host_slot, e.host_pages = -1, [], hs, hp
        e.status = Status.SUSPENDED
    return moved


def to_device(mgr: "HybridCacheManager", entries: list[Entry]) -> int:
    """Resume suspended `entries` into any free device slots and pages; the host records are released.
    Raises OutOfDeviceMemoryError (changing nothing) when the device has too little free."""
    need = sum(len(e.host_pages) for e in entries)
    if len(entries) > mgr.slot_pool.num_free or need > mgr.page_pool.num_free:
        raise OutOfDeviceMemoryError(
            f"resume needs {len(entries)} slots and {need} pages; "
            f"{mgr.slot_pool.num_free} and {mgr.page_pool.num_free} are free"
        )
    slots = mgr.slot_pool.allocate(len(entries))
    pages = [mgr.page_pool.allocate(len(e.host_pages)) for e in entries]
    host = mgr.host_tier
    moved = copy_in(mgr, host, slots, [p for ps in pages for p in ps], [e.host_slot for e in entries],
                    [p for e in entries for p in e.host_pages])
    for e, s, ps in zip(entries, slots, pages):
        host.slot_pool.release([e.host_slot])
        host.page_pool.release(e.host_pages)
        e.slot, e.pages, e.host_slot, e.host_pages = s, ps, -1, []
        e.status = Status.GENERATION
    return moved
