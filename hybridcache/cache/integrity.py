"""`check_integrity`: ownership invariants of both tiers, checked against every request's holdings."""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from .entries import Status, pages_for
from .errors import IntegrityError
from .id_pool import IdPool

if TYPE_CHECKING:
    from .planner import Planner


def _check_pool(name: str, pool: IdPool, holders: Counter) -> None:
    try:
        pool.check()
    except AssertionError as err:
        raise IntegrityError(f"{name}: {err}") from None
    for i, n in holders.items():
        if not 0 <= i < pool.total:
            raise IntegrityError(f"{name}: id {i} is outside the pool of {pool.total}")
        if i >= pool.permanent and pool.refcount(i) != n:
            raise IntegrityError(f"{name}: id {i} has {n} holders but refcount {pool.refcount(i)}")
    owned = {i for i in holders if i >= pool.permanent}
    if owned != set(pool.owned_ids()):
        raise IntegrityError(f"{name}: pool owns {sorted(set(pool.owned_ids()) ^ owned)} that no request holds")


def check_integrity(mgr: "Planner") -> None:
    """Every slot and page has at most one owner and, per tier, free + owned + permanent == total."""
    slots, pages, host_slots, host_pages, dummy_slots = Counter(), Counter(), Counter(), Counter(), Counter()
    for e in mgr.entries():
        holds_device = e.slot >= 0 or bool(e.pages)
        holds_host = e.host_slot >= 0 or bool(e.host_pages)
        if e.status == Status.WAITING and (holds_device or holds_host or e.num_tokens):
            raise IntegrityError(f"waiting request {e.req_id!r} holds state")
        if e.on_device:
            if e.slot < mgr.slot_pool.permanent or holds_host:
                raise IntegrityError(f"device request {e.req_id!r} holds slot {e.slot} / host state")
            if len(e.pages) < pages_for(e.num_tokens, mgr.page_size) and mgr.has_pages:
                raise IntegrityError(f"request {e.req_id!r}: {e.num_tokens} tokens on {len(e.pages)} pages")
        if e.status == Status.SUSPENDED:  # its shared pages stay on the device, the rest on the host
            if e.slot >= 0 or e.host_slot < 0:
                raise IntegrityError(f"suspended request {e.req_id!r} holds a device slot or no host slot")
            if len(e.pages) + len(e.host_pages) != mgr.live_pages(e):
                raise IntegrityError(f"suspended request {e.req_id!r}: {len(e.pages)} device and "
                                     f"{len(e.host_pages)} host pages for {e.num_tokens} tokens")
        if e.status == Status.DUMMY:
            if not 0 <= e.slot < mgr.slot_pool.permanent or e.pages or holds_host:
                raise IntegrityError(f"dummy {e.req_id!r} must hold exactly one permanent slot")
            dummy_slots[e.slot] += 1
        elif e.slot >= 0:
            slots[e.slot] += 1
        pages.update(e.pages)
        if e.host_slot >= 0:
            host_slots[e.host_slot] += 1
        host_pages.update(e.host_pages)
    for counter, what in ((slots, "device slot"), (host_slots, "host slot"), (dummy_slots, "dummy slot")):
        twice = [i for i, n in counter.items() if n > 1]
        if twice:
            raise IntegrityError(f"{what}s owned twice: {twice}")
    free_dummies = mgr.free_dummy_slots
    if sorted(free_dummies + list(dummy_slots)) != list(range(mgr.num_dummies)):
        raise IntegrityError("dummy slots: free + owned != permanent")
    if mgr.prefix is not None:
        _check_prefix(mgr, pages, host_slots, host_pages)
    _check_pool("device slots", mgr.slot_pool, slots)
    _check_pool("device pages", mgr.page_pool, pages)
    _check_pool("host slots", mgr.host_slot_pool, host_slots)
    _check_pool("host pages", mgr.host_page_pool, host_pages)


def _check_prefix(mgr: "Planner", pages: Counter, host_slots: Counter, host_pages: Counter) -> None:
    """The prefix index's pages join the page holders (its spilled pages and snapshots the host tier's);
    every node's page and snapshot is in exactly one tier; every snapshot id is held exactly as often as the
    index, admitted requests and the pending step pin it; every node leads to a snapshot; a request's
    shared or indexed pages hold only committed tokens (nothing writes a shared page)."""
    prefix = mgr.prefix
    snaps: Counter = Counter()
    indexed = set()
    for n in prefix.index.nodes.values():
        if n.page >= 0:
            pages[n.page] += 1
            indexed.add(n.page)
        if n.snapshot >= 0:
            snaps[n.snapshot] += 1
        if n.host_page >= 0:
            host_pages[n.host_page] += 1
        if n.host_snapshot >= 0:
            host_slots[n.host_snapshot] += 1
        if (n.page >= 0 and n.host_page >= 0) or (mgr.has_pages and n.page < 0 and n.host_page < 0) \
                or (n.snapshot >= 0 and n.host_snapshot >= 0):
            raise IntegrityError(f"prefix node at depth {n.depth} is in both tiers or in neither")
        if n.parent is not None and prefix.index.nodes.get(n.parent.key) is not n.parent:
            raise IntegrityError(f"prefix node at depth {n.depth} has a parent outside the index")
    children = Counter(id(n.parent) for n in prefix.index.nodes.values() if n.parent is not None)
    for n in prefix.index.nodes.values():
        if children[id(n)] != n.children:
            raise IntegrityError(f"prefix node at depth {n.depth}: {n.children} children counted, {children[id(n)]} found")
        if not n.cached and n.children == 0:
            raise IntegrityError(f"prefix node at depth {n.depth} leads to no snapshot")
    for e in mgr.entries():
        if e.restore >= 0:
            snaps[e.restore] += 1
        if e.copy_src >= 0:
            if e.copy_src not in indexed:
                raise IntegrityError(f"request {e.req_id!r} copies page {e.copy_src}, which no partial node holds")
            pages[e.copy_src] += 1
        full = e.num_tokens // mgr.page_size
        for k, p in enumerate(e.pages):
            if k >= full and (p in indexed or pages[p] > 1):
                raise IntegrityError(f"request {e.req_id!r}: page {p} is shared but holds uncommitted tokens")
    if mgr.pending is not None:
        snaps.update(mgr.pending.restore_ids)
        pages.update(mgr.pending.page_copies[0].tolist())
    if prefix.saving is not None:
        snaps.update(prefix.saving.ids)
        pages.update(prefix.saving.page_copies[1])
    _check_pool("snapshots", prefix.snap_pool, snaps)
