"""The planner walk's closing rules (`planner_shadow.Model`): a pending step committed (counts drawn,
some refused), committed unsettled as asynchronous verify does, or aborted; the oldest unsettled step
settled; a move or a re-carve committed, cancelled or lost. Each updates the shadow `m` as the planner must."""
from __future__ import annotations

import numpy as np

from hybridcache.cache import InvalidCountError, InvalidTransitionError, StepPlan
from tests.cache.planner_walk import GENERATION, ON_DEVICE, SUSPENDED, WAITING, Req


class Closings:
    """Rules over `m`, the shadow model (its planner, requests, pending plans, stats and `refused`)."""

    def __init__(self, m) -> None:
        self.m = m

    def finish_step(self, d) -> None:
        """Abort the pending step, commit it unsettled, or commit it with drawn counts."""
        m = self.m
        p, plan = m.planner, m.step
        if d.int(0, 9) == 9:
            dropped = p.abort_step(plan)
            rows = [r for r, dummy in zip(plan.req_ids, plan.dummy) if not dummy]
            assert dropped == rows
            for r in rows:
                m.reqs[r] = Req(WAITING)
            m.unsettled = [([None if x is None or x[0] in rows else x for x in entries], fed)
                           for entries, fed in m.unsettled]
            m.stats["aborted_rows"] += len(rows)
            m.step = None
            m.outcomes["abort"] += 1
            return
        if d.int(0, 9) >= 8:
            return self.commit_unsettled(plan)
        gen = plan.generation.tolist()
        n = plan.num_new.tolist()
        valid = [d.int(1, k) if g else d.int(0, k + 2) for g, k in zip(gen, n)]  # context counts are ignored
        form = d.int(0, 5)
        arg = None if form == 5 else np.array(valid) if form == 4 else valid
        if arg is None:
            valid = n
        accept = p.check_accept(plan, arg)
        rows = np.flatnonzero(gen)
        assert accept.slots.tolist() == plan.slots[rows].tolist()
        assert accept.num_tokens.tolist() == [n[i] for i in rows]
        assert accept.num_valid.tolist() == [valid[i] for i in rows]
        p.commit_step(plan, accept)
        for r, g, k, v, dummy in zip(plan.req_ids, gen, n, valid, plan.dummy.tolist()):
            if not dummy:
                m.reqs[r].tokens += v if g else k
        m.step = None
        m.outcomes["commit"] += 1

    def commit_unsettled(self, plan: StepPlan) -> None:
        """Asynchronous verify's commit: every generation row commits all it fed, settled later."""
        m = self.m
        p = m.planner
        if not plan.generation.all() or plan.dummy.any():
            return m.refused(InvalidTransitionError, lambda: p.commit_unsettled(plan))
        p.commit_unsettled(plan)
        n = plan.num_new.tolist()
        for r, k in zip(plan.req_ids, n):
            m.reqs[r].tokens += k
        m.unsettled.append(([(r, m.reqs[r]) for r in plan.req_ids], n))
        m.step = None
        m.outcomes["commit unsettled"] += 1

    def still_generating(self, x: tuple[str, Req] | None) -> bool:
        """Whether an unsettled row is still the request it committed for, generating."""
        m = self.m
        return x is not None and m.reqs.get(x[0]) is x[1] and x[1].status == GENERATION

    def settle(self, d) -> None:
        """The oldest unsettled step read back: each row keeps 1..fed tokens; bad counts change nothing."""
        m = self.m
        p = m.planner
        entries, fed = m.unsettled[0]
        valid = [d.int(1, k) for k in fed]
        if d.int(0, 7) == 7:
            bad = d.pick([valid + [1], [k + 1 for k in fed] or [1], [0] * len(fed) or [1, 1]])
            return m.refused(InvalidCountError, lambda: p.settle(bad))
        p.settle(valid)
        m.unsettled.pop(0)
        for x, k, v in zip(entries, fed, valid):
            if self.still_generating(x):
                x[1].tokens -= k - v
        m.outcomes["settle"] += 1

    def finish_move(self, d) -> None:
        m = self.m
        p, plan = m.planner, m.move
        if d.int(0, 3) == 3:
            p.cancel_move(plan)
            m.assert_as_planned()
            m.outcomes["cancel move"] += 1
        else:
            nbytes = d.int(0, 1 << 20)
            p.commit_move(plan, nbytes)
            at = 0
            for r, k, s, hs in zip(plan.req_ids, plan.page_counts, plan.slots, plan.host_slots):
                e, q = p.entry(r), m.reqs[r]
                if plan.to_host:
                    want = (-1, [], hs, list(plan.host_pages[at : at + k]))
                    assert (e.slot, e.pages, e.host_slot, e.host_pages) == want
                    q.status, q.pages, q.host_pages = SUSPENDED, 0, k
                else:
                    assert (e.slot, e.pages, e.host_slot, e.host_pages) == (s, list(plan.pages[at : at + k]), -1, [])
                    q.status, q.pages, q.host_pages = GENERATION, k, 0
                at += k
            key = ("suspensions", "bytes_to_host") if plan.to_host else ("resumes", "bytes_to_device")
            m.stats[key[0]] += len(plan.req_ids)
            m.stats[key[1]] += nbytes
            m.outcomes["suspend" if plan.to_host else "resume"] += bool(plan.req_ids)
        m.move, m.last_move = None, plan

    def finish_rebalance(self, d) -> None:
        m = self.m
        p, plan = m.planner, m.move
        live = m.ids(*ON_DEVICE)
        roll = d.int(0, 9)
        if roll == 8:
            assert p.cancel_rebalance(plan, state_lost=False) == []
            m.assert_as_planned()
            m.outcomes["cancel rebalance"] += 1
        elif roll == 9:
            assert p.cancel_rebalance(plan, state_lost=True) == live
            for r in live:
                m.reqs[r] = Req(WAITING)
            m.stats["aborted_rows"] += len(live)
            m.outcomes["rebalance lost"] += 1
        else:
            p.commit_rebalance(plan)
            m.num_slots, m.num_pages = plan.new_slots - plan.num_dummies, plan.new_pages
            at = 0
            for r, slot in zip(live, plan.slots_to):
                q, e = m.reqs[r], p.entry(r)
                assert e.slot == slot and e.pages == list(range(at, at + q.pages))  # it keeps what it held
                at += q.pages
            m.stats["rebalances"] += 1
            m.outcomes["rebalance"] += 1
        m.move, m.last_move = None, plan
