"""The planner walk's step rules (`planner_shadow.Model`): rows allocated, planned (in the order drawn, or
the last plan's order again, as steady decoding does) and refused where the shadow says they must be; each
step plan is checked field by field and its page-table writes rebuild every row's pages exactly."""
from __future__ import annotations

import numpy as np

from hybridcache.cache import InvalidCountError, InvalidTransitionError, OutOfDeviceMemoryError, StepPlan
from hybridcache.cache.counts import MAX_TOKENS
from tests.cache.planner_walk import CONTEXT, DUMMY, GENERATION, ON_DEVICE, WAITING


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Steps:
    """Rules over `m`, the shadow model (its planner, requests, table, outcomes and `refused`)."""

    def __init__(self, m) -> None:
        self.m = m

    def allocate(self, d, rows: list[str] | None = None) -> bool:
        m = self.m
        if rows is None:
            rows = d.subset(m.ids(WAITING, CONTEXT, GENERATION, DUMMY), 0)
        arg, n = m.counts_for(d, rows)
        fresh = [r for r in rows if m.reqs[r].status == WAITING]
        grow = [m.growth(r, k) for r, k in zip(rows, n)]
        free_slots, free_pages, _, _ = m.expected_free()
        if len(fresh) > free_slots or sum(grow) > free_pages:
            before = m.snapshot()
            assert m.planner.allocate(rows, arg) is False
            assert m.snapshot() == before
            m.outcomes["allocate refused"] += 1
            return False
        assert m.planner.allocate(rows, arg) is True
        for r in fresh:
            m.reqs[r].status, m.reqs[r].fresh = CONTEXT, True
        for r, g in zip(rows, grow):
            m.reqs[r].pages += g
        m.outcomes["allocate"] += 1
        return True

    def allocate_and_plan(self, d) -> None:
        """What an engine does: allocate the rows, then plan them (sometimes in another row order)."""
        m = self.m
        rows = d.subset(m.ids(WAITING, CONTEXT, GENERATION, DUMMY), 1)
        self._allocate_then_plan(d, rows)

    def decode(self, d) -> None:
        """The last planned rows again, the steady state of decoding: the planner reuses its layout."""
        m = self.m
        key = list(m.key)
        if not key or any(r not in m.reqs or m.reqs[r].status not in (*ON_DEVICE, DUMMY) for r in key):
            return self.allocate_and_plan(d)
        self._allocate_then_plan(d, key, reorder=False)

    def _allocate_then_plan(self, d, rows: list[str], reorder: bool = True) -> None:
        m = self.m
        arg, n = m.counts_for(d, rows)
        fresh = [r for r in rows if m.reqs[r].status == WAITING]
        grow = [m.growth(r, k) for r, k in zip(rows, n)]
        free_slots, free_pages, _, _ = m.expected_free()
        ok = len(fresh) <= free_slots and sum(grow) <= free_pages
        assert m.planner.allocate(rows, arg) is ok
        if not ok:
            m.outcomes["allocate refused"] += 1
            return
        for r in fresh:
            m.reqs[r].status, m.reqs[r].fresh = CONTEXT, True
        for r, g in zip(rows, grow):
            m.reqs[r].pages += g
        if reorder and len(rows) > 1 and d.int(0, 3) == 3:
            order = d.subset(range(len(rows)), len(rows), len(rows))
            rows, arg = [rows[i] for i in order], [n[i] for i in order]
            n = arg
        self.plan(d, rows, arg, n)

    def plan_only(self, d) -> None:
        """Plan rows on what they already hold; a count past a row's pages is refused."""
        m = self.m
        rows = d.subset(m.ids(CONTEXT, GENERATION, DUMMY), 1)
        n = []
        for r in rows:
            q = m.reqs[r]
            room = q.pages * m.cfg.page_size - q.tokens if m.cfg.has_pages and q.status != DUMMY else 8
            n.append(d.int(1, max(1, room)) if d.int(0, 4) < 4 else d.int(1, room + 2 * m.cfg.page_size + 1))
        self.plan(d, rows, n, n)

    def plan(self, d, rows: list[str], arg, n: list[int]) -> None:
        m = self.m
        p, cfg = m.planner, m.cfg
        if any(m.reqs[r].status not in (*ON_DEVICE, DUMMY) for r in rows):
            return m.refused(InvalidTransitionError, lambda: p.plan_step(rows, arg))
        if any(m.reqs[r].tokens + k > MAX_TOKENS for r, k in zip(rows, n)):
            m.outcomes["past int32"] += 1
            return m.refused(InvalidCountError, lambda: p.plan_step(rows, arg))
        if any(m.reqs[r].status != DUMMY and cfg.has_pages
               and ceil_div(m.reqs[r].tokens + k, cfg.page_size) > m.reqs[r].pages for r, k in zip(rows, n)):
            return m.refused(OutOfDeviceMemoryError, lambda: p.plan_step(rows, arg))
        if m.unsettled:
            last = m.unsettled[-1][0]
            if tuple(rows) != tuple(x[0] if x else None for x in last) and any(map(m.closings.still_generating, last)):
                return m.refused(InvalidTransitionError, lambda: p.plan_step(rows, arg))
        plan = p.plan_step(rows, arg)
        assert plan.lens_on_device == bool(m.unsettled)
        entries = [p.entry(r) for r in rows]
        assert plan.req_ids == tuple(rows) and plan.batch_size == len(rows)
        assert plan.slots.tolist() == [e.slot for e in entries]
        assert plan.dummy.tolist() == [m.reqs[r].status == DUMMY for r in rows]
        assert plan.generation.tolist() == [m.reqs[r].status == GENERATION for r in rows]
        assert plan.cached_lens.tolist() == [m.reqs[r].tokens for r in rows]
        assert plan.num_new.tolist() == list(n)
        assert plan.fresh.tolist() == [m.reqs[r].fresh for r in rows]
        assert plan.zero_slots.tolist() == [e.slot for r, e in zip(rows, entries) if m.reqs[r].fresh]
        for r in rows:
            m.reqs[r].fresh = False
        self.check_table(plan, entries)
        m.step = m.last_step = plan
        m.outcomes["plan"] += 1

    def check_table(self, plan: StepPlan, entries) -> None:
        """Apply the plan's writes as a store would; the table must then hold exactly each row's pages."""
        m = self.m
        assert plan.version >= m.version
        if plan.version != m.version:
            m.version, m.key = plan.version, plan.req_ids
            m.table = np.full((plan.batch_size, plan.table_width), -1, dtype=np.int64)
        else:
            assert plan.req_ids == m.key, "a layout version is one row order"
            assert plan.table_width >= m.table.shape[1]
            m.outcomes["layout reused"] += 1
            if plan.table_width > m.table.shape[1]:
                wider = np.full((plan.batch_size, plan.table_width), -1, dtype=np.int64)
                wider[:, : m.table.shape[1]] = m.table
                m.table = wider
        rows, cols, pages = plan.table_writes
        assert rows.shape == cols.shape == pages.shape
        assert ((0 <= cols) & (cols < plan.table_width)).all() and ((0 <= rows) & (rows < plan.batch_size)).all()
        assert len(set(zip(rows.tolist(), cols.tolist()))) == rows.size, "a cell written twice in one plan"
        assert (m.table[rows, cols] == -1).all(), "a write to a cell that already holds its page"
        m.table[rows, cols] = pages
        assert m.table.shape == (plan.batch_size, plan.table_width)
        for i, e in enumerate(entries):
            held = len(e.pages)
            assert m.table[i, :held].tolist() == e.pages, (plan.req_ids[i], m.table[i], e.pages)
            assert (m.table[i, held:] == -1).all()
