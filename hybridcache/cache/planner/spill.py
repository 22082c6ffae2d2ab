"""The planner's side of spilling cached prefix entries to the host tier and bringing them back.

A spill moves the least valuable unpinned device snapshots (`PrefixEviction.victim_order`) to host slots,
with the device pages that only the index holds and that lead to no device snapshot once the victims are
gone (a shared ancestor moves with the last of its subtree's snapshots); the rest of a chain stays where it
is, so a chain may be on the device near the root and in the host tier below. An unspill brings a match's
host pages and host snapshot back into new device pages and a snapshot row. Both are moves: `plan_*`
reserves the destination ids, the store copies the live bytes of the snapshot roles (`MovePlan.snapshot`),
then `commit_*` swaps the node's ids or `cancel_*` releases the reservation (the source is untouched). The
host tier is shared with suspended requests: a suspend or an adopt drops spilled entries before it is
refused (`make_host_room`).
"""
from __future__ import annotations

import dataclasses
from collections import Counter

from ..errors import InvalidTransitionError, OutOfDeviceMemoryError
from ..plans import MovePlan
from ..prefix_cache import PrefixMatch
from ..prefix_eviction import SUPERSEDED
from ..prefix_index import Node
from .core import PlannerCore


class Spill(PlannerCore):
    def plan_spill(self, pages: int = 0, snapshots: int = 0, protect: tuple[Node, ...] = ()) -> MovePlan | None:
        """Reserve host ids for victims until spilling them frees `pages` device pages and `snapshots`
        snapshot rows, as far as the host tier's free room goes (None: nothing to spill). A victim's
        snapshot goes, and with it every page that only the index holds and that then leads to no device
        snapshot. `protect`: nodes not to touch (a match about to be admitted)."""
        self._require_idle()
        pc = self.prefix
        if pc is None or (pages <= 0 and snapshots <= 0):
            return None
        keep = {id(n) for n in protect}
        self._displace_host(snapshots + int(pages > 0), keep)
        below = _device_snapshots_below(pc.index.snapshot_nodes())
        hs, hp = self.host_slot_pool, self.host_page_pool
        # pages that lead only to host snapshots already (a request held them at the last spill) go first
        orphans = [n for n in pc.index.nodes.values() if below[id(n)] == 0 and id(n) not in keep and n.page >= 0
                   and self.page_pool.refcount(n.page) == 1][: max(0, min(pages, hp.num_free))]
        victims, chains, freed = [], [orphans], len(orphans)
        order = pc.victim_order()
        for node in sorted(pc._evictable(), key=order):
            if freed >= pages and len(victims) >= snapshots:
                break
            if id(node) in keep or hs.num_free <= len(victims) or order(node)[0] == SUPERSEDED:
                continue  # a snapshot a later one of its chain supersedes is not worth a host record: dropped
            chain, n = [], node
            while n is not None and below[id(n)] == 1:  # its subtree's last device snapshot is the victim
                if id(n) not in keep and n.page >= 0 and self.page_pool.refcount(n.page) == 1:
                    chain.append(n)
                n = n.parent
            if hp.num_free < freed + len(chain):
                continue
            n = node
            while n is not None:
                below[id(n)] -= 1
                n = n.parent
            victims.append(node)
            chains.append(chain)
            freed += len(chain)
        if not victims and not orphans:
            return None
        plan = MovePlan(req_ids=(), to_host=True, slots=tuple(pc.row(n.snapshot) for n in victims),
                        host_slots=tuple(hs.allocate(len(victims))),
                        pages=tuple(n.page for c in chains for n in c),
                        host_pages=tuple(hp.allocate(sum(map(len, chains)))),
                        page_counts=(freed,), snapshot=True)
        self._moving = plan
        pc.spilling = (victims, [n for c in chains for n in c])
        return plan

    def _displace_host(self, want: int, keep: set[int]) -> None:
        """Make host room for the `want` device snapshots a spill would move first by dropping spilled
        entries worth less than each of them: the host tier is a cache too, not a record of the first
        entries that ever spilled."""
        pc, hs = self.prefix, self.host_slot_pool
        order = pc.victim_order()
        incoming = [n for n in sorted(pc._evictable(), key=order)
                    if id(n) not in keep and order(n)[0] > SUPERSEDED][:want]
        for k, node in enumerate(incoming):
            if hs.num_free > k:
                continue
            hosted = [n for n in pc.index.host_nodes() if id(n) not in keep and id(n) not in pc.protected]
            least = min(hosted, key=order, default=None)
            if least is None or order(least) >= order(node):
                return
            pc._drop(least, evicted=True)

    def commit_spill(self, plan: MovePlan) -> None:
        """The snapshots and pages are in their host records: the nodes now name those; the device ids go."""
        self._require_moving(plan)
        pc = self.prefix
        victims, nodes = pc.spilling
        for n, h in zip(victims, plan.host_slots):
            pc.snap_pool.release([n.snapshot])
            n.snapshot, n.host_snapshot = -1, h
        for n, h in zip(nodes, plan.host_pages):
            self.page_pool.release([n.page])
            n.page, n.host_page = -1, h
        pc.stats["spills"] += len(victims)
        pc.spilling = None
        self._moving = None

    def plan_unspill(self, match: PrefixMatch) -> MovePlan:
        """Reserve device pages (and a snapshot row) for the host pages and snapshot of a match's chain,
        evicting unpinned device entries outside the chain for room. Raises OutOfDeviceMemoryError
        (changing nothing but those evictions) when they do not fit."""
        self._require_idle()
        pc = self.prefix
        if pc is None or not match.unspill:
            raise InvalidTransitionError("that match holds nothing in the host tier")
        hit = match.nodes[-1]
        if any(n.page < 0 and n.host_page < 0 and self.has_pages for n in match.nodes) or not hit.cached or \
                any(pc.index.nodes.get(n.key) is not n for n in match.nodes):
            raise InvalidTransitionError("that match is stale: match again")
        host_nodes = [n for n in match.nodes if n.host_page >= 0]
        held = [n.page for n in match.nodes if n.page >= 0]
        self.page_pool.share(held)  # the chain's device pages and snapshot stay while room is made
        if hit.snapshot >= 0:
            pc.snap_pool.share([hit.snapshot])
        pc.protected = {id(n) for n in match.nodes}  # nor do its spilled nodes go
        try:
            sid = pc._free_snapshot() if hit.host_snapshot >= 0 else None
            room = self._room(len(host_nodes)) and (sid is not None or hit.host_snapshot < 0)
        finally:
            pc.protected = set()
            self.page_pool.release(held)
            if hit.snapshot >= 0:
                pc.snap_pool.release([hit.snapshot])
        if not room:
            if sid is not None:
                pc.snap_pool.release([sid])
            raise OutOfDeviceMemoryError(f"bringing a cached prefix back needs {len(host_nodes)} pages and a "
                                         f"snapshot row; {self.page_pool.num_free} pages are free")
        plan = MovePlan(req_ids=(), to_host=False, slots=() if sid is None else (pc.row(sid),),
                        host_slots=() if sid is None else (hit.host_snapshot,),
                        pages=tuple(self.page_pool.allocate(len(host_nodes))),
                        host_pages=tuple(n.host_page for n in host_nodes), page_counts=(len(host_nodes),),
                        snapshot=True)
        self._moving = plan
        pc.spilling = (([hit], [sid]) if sid is not None else ([], []), host_nodes)
        return plan

    def commit_unspill(self, plan: MovePlan, match: PrefixMatch) -> PrefixMatch:
        """The bytes are back on the device: the nodes name the device ids, the host ids go. Returns the
        match to admit."""
        self._require_moving(plan)
        pc = self.prefix
        (snap_nodes, sids), nodes = pc.spilling
        for n, sid in zip(snap_nodes, sids):
            self.host_slot_pool.release([n.host_snapshot])
            n.snapshot, n.host_snapshot = sid, -1
        for n, p in zip(nodes, plan.pages):
            self.host_page_pool.release([n.host_page])
            n.page, n.host_page = p, -1
        pc.stats["host_hits"] += 1
        pc.spilling = None
        self._moving = None
        return dataclasses.replace(match, snapshot=match.nodes[-1].snapshot, unspill=False)

    def cancel_spill(self, plan: MovePlan) -> None:
        """A spill or unspill copy failed: release the reserved destination ids; the index is as before."""
        self._require_moving(plan)
        pc = self.prefix
        if plan.to_host:
            self.host_slot_pool.release(list(plan.host_slots))
            self.host_page_pool.release(list(plan.host_pages))
        else:
            self.page_pool.release(list(plan.pages))
            pc.snap_pool.release([s - self.num_dummies for s in plan.slots])
        pc.spilling = None
        self._moving = None

    def make_host_room(self, slots: int, pages: int) -> bool:
        """Drop spilled entries (least valuable first) until `slots` host slots and `pages` host pages are
        free — or, when dropping them all would not do, change nothing. Suspended requests come first."""
        hs, hp, pc = self.host_slot_pool, self.host_page_pool, self.prefix
        if hs.num_free >= slots and hp.num_free >= pages:
            return True
        if pc is None:
            return False
        hosted = list(pc.index.host_nodes())
        kept = pc.index.kept_by(list(pc.index.snapshot_nodes()))
        freeable = sum(1 for n in pc.index.nodes.values() if n.host_page >= 0 and id(n) not in kept)
        if hs.num_free + len(hosted) < slots or hp.num_free + freeable < pages:
            return False
        for n in sorted(hosted, key=pc.victim_order()):
            if hs.num_free >= slots and hp.num_free >= pages:
                break
            pc._drop(n, evicted=True)
        return True


def _device_snapshots_below(snapshot_nodes) -> Counter:
    """id(node) -> how many device snapshots its subtree (itself included) holds."""
    below: Counter = Counter()
    for n in snapshot_nodes:
        while n is not None:
            below[id(n)] += 1
            n = n.parent
    return below
