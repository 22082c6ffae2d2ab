"""The planner walk's move rules (`planner_shadow.Model`): a suspension to host memory, a resumption and a
rebalance planned, or refused where the shadow says they must be; the ids each reserves are checked against
what requests hold. Their commits, cancels and losses are `planner_closing`'s."""
from __future__ import annotations

from hybridcache.cache import HostTierFullError, InvalidTransitionError, OutOfDeviceMemoryError
from tests.cache.planner_walk import GENERATION, ON_DEVICE, SUSPENDED


class Moves:
    """Rules over `m`, the shadow model (its planner, requests, pools and `refused`)."""

    def __init__(self, m) -> None:
        self.m = m

    def suspend(self, d) -> None:
        m = self.m
        p = m.planner
        rows = d.subset(m.ids(GENERATION), 0 if d.int(0, 9) == 9 else 1)  # now and then none
        if m.unsettled:
            return m.refused(InvalidTransitionError, lambda: p.plan_suspend(rows))
        live = [m.live_pages(m.reqs[r]) for r in rows]
        _, _, host_slots, host_pages = m.expected_free()
        if len(rows) > host_slots or sum(live) > host_pages:
            return m.refused(HostTierFullError, lambda: p.plan_suspend(rows))
        before = m.snapshot()
        plan = p.plan_suspend(rows)
        entries = [p.entry(r) for r in rows]
        assert plan.to_host and plan.req_ids == tuple(rows) and plan.page_counts == tuple(live)
        assert plan.slots == tuple(e.slot for e in entries)
        assert plan.pages == tuple(x for e, k in zip(entries, live) for x in e.pages[:k])
        held = p.entries()
        self.check_reserved(plan.host_slots, plan.host_pages, (len(rows), sum(live)),
                            (0, m.cfg.host_slots, m.cfg.host_pages),
                            ({e.host_slot for e in held}, {x for e in held for x in e.host_pages}))
        m.move, m.before_move, m.added = plan, before, []

    def resume(self, d) -> None:
        m = self.m
        p = m.planner
        rows = d.subset(m.ids(SUSPENDED), 0 if d.int(0, 9) == 9 else 1)
        if m.unsettled:
            return m.refused(InvalidTransitionError, lambda: p.plan_resume(rows))
        need = sum(m.reqs[r].host_pages for r in rows)
        slots, pages, _, _ = m.expected_free()
        if len(rows) > slots or need > pages:
            return m.refused(OutOfDeviceMemoryError, lambda: p.plan_resume(rows))
        before = m.snapshot()
        plan = p.plan_resume(rows)
        entries = [p.entry(r) for r in rows]
        assert not plan.to_host and plan.req_ids == tuple(rows)
        assert plan.page_counts == tuple(len(e.host_pages) for e in entries)
        assert plan.host_slots == tuple(e.host_slot for e in entries)
        assert plan.host_pages == tuple(x for e in entries for x in e.host_pages)
        held = p.entries()
        self.check_reserved(plan.slots, plan.pages, (len(rows), need),
                            (m.cfg.num_dummies, m.num_slots + m.cfg.num_dummies, m.num_pages),
                            ({e.slot for e in held}, {x for e in held for x in e.pages}))
        m.move, m.before_move, m.added = plan, before, []

    @staticmethod
    def check_reserved(slots, pages, want: tuple, bounds: tuple, held: tuple) -> None:
        """Reserved ids: `want` (slots, pages) of them, distinct, slots in [first, num_slots) and pages in
        [0, num_pages) (`bounds`), and none of the `held` (slots, pages) that requests hold."""
        first, num_slots, num_pages = bounds
        assert (len(slots), len(pages)) == want
        assert len(set(slots)) == len(slots) and len(set(pages)) == len(pages)
        assert all(first <= s < num_slots for s in slots) and all(0 <= x < num_pages for x in pages)
        assert not set(slots) & held[0] and not set(pages) & held[1]

    def rebalance(self, d) -> None:
        m = self.m
        p, cfg = m.planner, m.cfg
        num_slots = cfg.num_slots + 2 - d.int(0, cfg.num_slots + 2)  # 0 to a few more than at the start
        num_pages = cfg.num_pages + 8 - d.int(0, cfg.num_pages + 8)
        if m.unsettled:
            return m.refused(InvalidTransitionError, lambda: p.plan_rebalance(num_slots, num_pages))
        live = m.ids(*ON_DEVICE)
        counts = [m.live_pages(m.reqs[r]) for r in live]
        held = [m.reqs[r].pages for r in live]
        if num_slots < 1 or len(live) > num_slots or sum(held) > num_pages:
            return m.refused(OutOfDeviceMemoryError, lambda: p.plan_rebalance(num_slots, num_pages))
        before = m.snapshot()
        plan = p.plan_rebalance(num_slots, num_pages)
        entries = [p.entry(r) for r in live]
        dummies = cfg.num_dummies
        assert (plan.old_slots, plan.old_pages) == (m.num_slots + dummies, m.num_pages)
        assert (plan.new_slots, plan.new_pages, plan.num_dummies) == (num_slots + dummies, num_pages, dummies)
        assert plan.slots_from == tuple(e.slot for e in entries)
        assert plan.slots_to == tuple(range(dummies, dummies + len(live)))
        assert plan.pages_from == tuple(x for e, k in zip(entries, counts) for x in e.pages[:k])
        starts = [sum(held[:i]) for i in range(len(held))]
        assert plan.pages_to == tuple(s + j for s, k in zip(starts, counts) for j in range(k))
        m.move, m.before_move, m.added = plan, before, []
