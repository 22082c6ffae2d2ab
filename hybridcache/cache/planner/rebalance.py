"""The planner's rebalance: where every live request's slot and pages go in a new carving of the device
budget (`plan_rebalance`), then the new pools (`commit_rebalance`) or the old ones (`cancel_rebalance`)."""
from __future__ import annotations

from typing import Hashable

from ..entries import Entry, Status
from ..errors import OutOfDeviceMemoryError
from ..id_pool import IdPool
from ..plans import RecarvePlan
from .core import PlannerCore


class Rebalance(PlannerCore):
    def plan_rebalance(self, num_slots: int, num_pages: int) -> RecarvePlan:
        """Where every live request's slot and pages go in a carving of `num_slots` request slots and
        `num_pages` pages, compacted from row 0. A request keeps as many pages as it holds (what it was
        allocated is its own); only those holding committed tokens are copied. Raises
        OutOfDeviceMemoryError when they do not fit."""
        self._require_idle()
        self._require_settled()
        live = [e for e in self._entries.values() if e.on_device]
        _, held = self.live_counts()
        if num_slots < 1 or len(live) > num_slots or held > num_pages:
            raise OutOfDeviceMemoryError(
                f"{len(live)} live requests holding {held} pages do not fit {num_slots} slots and {num_pages} pages"
            )
        fixed_rows, extra = [], []
        if self.prefix is not None:  # cached pages move too, as far as they fit; held snapshot rows move in place
            if held + len(self.prefix.index_only_pages()) > num_pages:
                self.prefix.drop_all_unpinned()  # pinned chains are held by their requests: none is left over
            extra = self.prefix.index_only_pages()
            fixed_rows = [self.prefix.row(i) for i in self.prefix.snap_pool.owned_ids()]
        extra = self._suspended_pages(live) + extra  # suspended requests' shared pages move too
        plan = RecarvePlan.compacting(
            (self.slot_pool.total, self.page_pool.total), num_slots, num_pages, self.num_dummies,
            [e.slot for e in live], [e.pages for e in live], [self.live_pages(e) for e in live],
            num_fixed=self.num_fixed, fixed_rows=fixed_rows, extra_pages=extra,
        )
        self._moving = plan
        return plan

    def commit_rebalance(self, plan: RecarvePlan) -> None:
        """The store moved the live rows: swap in the new pools and the requests' new ids."""
        self._require_moving(plan)
        live = [e for e in self._entries.values() if e.on_device]
        slot_pool = IdPool(plan.new_slots, permanent=plan.fixed)
        page_pool = IdPool(plan.new_pages)
        slots = slot_pool.allocate(len(live))
        new_id: dict[int, int] = {}
        for e in live:  # the order RecarvePlan.compacting numbered the distinct pages in
            for p in e.pages:
                new_id.setdefault(p, len(new_id))
        for p in self._suspended_pages(live):
            new_id.setdefault(p, len(new_id))
        nodes = list(self.prefix.index.nodes.values()) if self.prefix is not None else []
        for n in nodes:
            if n.page >= 0:
                new_id.setdefault(n.page, len(new_id))
        page_pool.allocate(len(new_id))
        for e, slot in zip(live, slots):
            e.slot, e.pages = slot, [new_id[p] for p in e.pages]
            page_pool.share(e.pages)
            if e.copy_src >= 0:  # a pinned partial page is an index node's: it moved with the index
                e.copy_src = new_id[e.copy_src]
                page_pool.share([e.copy_src])
        for e in self._entries.values():
            if e.status == Status.SUSPENDED:
                e.pages = [new_id[p] for p in e.pages]
                page_pool.share(e.pages)
        for n in nodes:
            if n.page >= 0:
                n.page = new_id[n.page]
                page_pool.share([n.page])
        page_pool.release(list(range(len(new_id))))  # the allocation's own reference: holders remain
        self.slot_pool, self.page_pool = slot_pool, page_pool
        self.stats["rebalances"] += 1
        self._moving = None
        self._layout = None

    def cancel_rebalance(self, plan: RecarvePlan, state_lost: bool) -> list[Hashable]:
        """The store could not finish. Without `state_lost` it restored the old carving and nothing
        changed; with it, every live request restarts from its tokens (returned)."""
        self._require_moving(plan)
        self._moving = None
        if not state_lost:
            return []
        dropped = []
        for e in self._entries.values():  # a suspended request's shared pages were on the device too
            if e.on_device or (e.status == Status.SUSPENDED and e.pages):
                self._release(e)
                e.status, e.num_tokens = Status.WAITING, 0
                dropped.append(e.req_id)
        self.slot_pool = IdPool(plan.old_slots, permanent=plan.fixed)
        self.page_pool = IdPool(plan.old_pages)
        if self.prefix is not None:  # the device lost every row: the index and its snapshots go
            self.prefix.clear()
            self.prefix.snap_pool = IdPool(self.prefix.snap_pool.total)
        self.stats["aborted_rows"] += len(dropped)
        self._layout = None
        return dropped

    # ------------------------------------------------------------------ internals
    def _suspended_pages(self, live: list[Entry]) -> list[int]:
        """The device pages suspended requests keep (always full) that no live request holds, in entry order."""
        held = {p for e in live for p in e.pages}
        out: dict[int, None] = {}
        for e in self._entries.values():
            if e.status == Status.SUSPENDED:
                out.update((p, None) for p in e.pages if p not in held)
        return list(out)
