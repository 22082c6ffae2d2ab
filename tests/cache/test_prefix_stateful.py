"""Stateful fuzz of the planner with prefix caching: requests of a few prefix groups are admitted at cached
prefixes, prefill, generate, save snapshots, are suspended, resumed, re-prefilled, aborted and freed, while
rebalances re-carve, a small snapshot pool and page pool force evictions, and cached entries spill to the
host tier and come back (copies that fail half the time cancel). After every operation
`check_integrity()` holds (every shared page's reference count equals its holders, no snapshot is both
held and free, every index node leads to a snapshot), and every admission restores a snapshot saved from
exactly the tokens it skips. Reuses the draw helpers of `test_planner_stateful`."""
from __future__ import annotations

import random

import pytest

from hybridcache.cache import HostTierFullError, OutOfDeviceMemoryError, Planner, Status
from tests.cache.planner_walk import RandomDraw


class PrefixModel:
    def __init__(self, rng: random.Random) -> None:
        self.d = RandomDraw(rng)
        d = self.d
        self.page = d.pick([1, 2, 4])
        self.interval = self.page * d.int(1, 3)
        self.planner = Planner(self.page, d.pick([True, True, False]), num_slots=d.int(2, 4), num_pages=d.int(12, 40),
                               num_dummies=d.int(0, 1), host_slots=d.int(0, 3), host_pages=d.int(0, 30),
                               num_snapshots=d.int(1, 4), snapshot_interval=self.interval)
        self.groups = [[d.int(0, 5) for _ in range(d.int(0, 12))] for _ in range(3)]
        self.tokens: dict[int, list[int]] = {}
        self.saved: dict[int, list[int]] = {}  # snapshot id -> the tokens it is the state after
        self.saved_host: dict[int, list[int]] = {}  # the same for spilled snapshots, by host slot
        self.next_id = 0
        self.hits = 0
        self.partial_hits = 0  # admissions at a partial node (inside a page)
        self.ended: list[list[int]] = []  # finished requests' tokens: a later request may continue one

    def ids(self, *statuses: Status) -> list[int]:
        return [r for r in self.planner.requests() if self.planner.status(r) in statuses]

    # ------------------------------------------------------------------ operations
    def add(self) -> None:
        d = self.d
        rid, self.next_id = self.next_id, self.next_id + 1
        head = d.pick(self.ended) if self.ended and d.int(0, 2) == 0 else d.pick(self.groups)  # a next turn
        self.tokens[rid] = head + [d.int(0, 5) for _ in range(d.int(1, 10))]
        self.planner.add(rid)

    def admit(self) -> None:
        waiting = self.ids(Status.WAITING)
        if not waiting:
            return
        rid = self.d.pick(waiting)
        toks = self.tokens[rid]
        m = self.planner.match_prefix(rid, toks, len(toks))
        if m.defer:
            assert m.leader is not None and m.branch > m.tokens
            return
        if m.unspill:
            m = self._unspill(rid, m)
            if m is None:
                return
        if m.snapshot >= 0:
            assert self.saved[m.snapshot] == toks[: m.tokens], "restored a snapshot of other tokens"
        assert m.tokens < len(toks) and (not m.nodes or m.tokens == m.nodes[-1].num_tokens(self.page))
        assert not m.nodes or m.nodes[-1].fill or m.tokens % self.page == 0  # a page boundary or a request's end
        chunk = self._chunk(rid, m.tokens, m.keeps)
        before = self.planner.prefix.stats["hits"]
        if self.planner.allocate([rid], chunk, prefix=m):
            self.partial_hits += bool(m.nodes and m.nodes[-1].fill)
            assert self.planner.prefix.stats["hits"] - before == m.tokens
            assert self.planner.entry(rid).num_tokens == m.tokens
            self._step([rid], [chunk])

    def prefill(self) -> None:
        ctx = self.ids(Status.CONTEXT)
        if not ctx:
            return
        rid = self.d.pick(ctx)
        e = self.planner.entry(rid)
        chunk = self._chunk(rid, e.num_tokens, e.keeps)
        if self.planner.allocate([rid], chunk):
            self._step([rid], [chunk])

    def decode(self) -> None:
        gen = self.ids(Status.GENERATION)
        if not gen:
            return
        rows = self.d.subset(gen, 1, 3)
        T = self.d.int(1, 3)
        if not self.planner.allocate(rows, T):
            return
        valid = [self.d.int(1, T) for _ in rows]
        for r, v in zip(rows, valid):
            self.tokens[r] += [self.d.int(0, 5) for _ in range(v)]
        self._step(rows, [T] * len(rows), valid)

    def _unspill(self, rid: int, m):
        """Bring the match's host entries back (None when the copy "fails": the index is as before)."""
        p = self.planner
        e = p.entry(rid)
        try:
            plan = p.plan_unspill(m)
        except OutOfDeviceMemoryError:
            return p.prefix.match(e, (), m.context_len, host_ok=False)
        (nodes, sids), _ = p.prefix.spilling
        hosts = [n.host_snapshot for n in nodes]
        if self.d.int(0, 3) == 0:
            p.cancel_spill(plan)
            return None
        m = p.commit_unspill(plan, m)
        for h, sid in zip(hosts, sids):
            self.saved[sid] = self.saved_host.pop(h)
        return m

    def spill(self) -> None:
        p = self.planner
        plan = p.plan_spill(pages=self.d.int(0, 4), snapshots=self.d.int(0, 2))
        if plan is None:
            return
        sids = [n.snapshot for n in p.prefix.spilling[0]]
        if self.d.int(0, 3) == 0:
            p.cancel_spill(plan)
            return
        p.commit_spill(plan)
        for sid, h in zip(sids, plan.host_slots):
            self.saved_host[h] = self.saved.pop(sid)

    def _chunk(self, rid: int, start: int, keeps) -> int:
        chunk = self.d.int(1, len(self.tokens[rid]) - start)
        keep = next((b for b in keeps if b > start), None)
        return min(chunk, keep - start) if keep is not None else chunk

    def _step(self, rows: list[int], n: list[int], valid: list[int] | None = None) -> None:
        p = self.planner
        plan = p.plan_step(rows, n)
        for slot, row in zip(*plan.restore):
            assert row >= p.num_dummies and slot >= p.num_fixed
        for src, dst in zip(*plan.page_copies):  # a partial page is copied into a page of the row's own
            assert src != dst and any(p.entry(r).pages.count(dst) == 1 for r in rows)
        if self.d.int(0, 9) == 0:
            p.abort_step(plan)
            return
        p.commit_step(plan, p.check_accept(plan, valid))
        for r in rows:
            e = p.entry(r)
            if e.status == Status.CONTEXT and e.num_tokens == len(self.tokens[r]):
                p.start_generation(r)
        save = p.plan_snapshots(lambda r: self.tokens[r])
        if save is None:
            return
        p.check_integrity()
        if self.d.int(0, 5) == 0:
            p.cancel_snapshots(save)
            return
        p.commit_snapshots(save)
        for rid, b, sid in zip(save.req_ids, save.boundaries, save.ids):
            if p.prefix.snap_pool.refcount(sid):
                self.saved[sid] = self.tokens[rid][:b]

    def suspend_resume(self) -> None:
        p = self.planner
        if self.d.int(0, 1):
            gen = self.ids(Status.GENERATION)
            if gen:
                try:
                    plan = p.plan_suspend([self.d.pick(gen)])
                except HostTierFullError:
                    return
                p.commit_move(plan, 0)
        else:
            sus = self.ids(Status.SUSPENDED)
            if sus:
                try:
                    plan = p.plan_resume([self.d.pick(sus)])
                except OutOfDeviceMemoryError:
                    return
                p.cancel_move(plan) if self.d.int(0, 3) == 0 else p.commit_move(plan, 0)

    def finish(self) -> None:
        """A generating request ends: its committed end is saved (a partial node inside a page), then it is freed."""
        gen = self.ids(Status.GENERATION)
        if not gen:
            return
        p, rid = self.planner, self.d.pick(gen)
        p.save_at_end([rid])
        save = p.plan_snapshots(lambda r: self.tokens[r])
        if save is not None:
            if self.d.int(0, 5) == 0:
                p.cancel_snapshots(save)
            else:
                p.commit_snapshots(save)
                for r, b, sid in zip(save.req_ids, save.boundaries, save.ids):
                    if p.prefix.snap_pool.refcount(sid):
                        self.saved[sid] = self.tokens[r][:b]
        p.free(rid)
        self.ended.append(self.tokens.pop(rid))

    def drop(self) -> None:
        live = self.ids(Status.CONTEXT, Status.GENERATION, Status.SUSPENDED, Status.WAITING)
        if not live:
            return
        rid = self.d.pick(live)
        if self.d.int(0, 1) and self.planner.status(rid) != Status.WAITING:
            self.planner.reprefill(rid)
        else:
            self.planner.free(rid)
            del self.tokens[rid]

    def rebalance(self) -> None:
        p = self.planner
        try:
            plan = p.plan_rebalance(self.d.int(1, 4), self.d.int(4, 40))
        except OutOfDeviceMemoryError:
            return
        if self.d.int(0, 4) == 0:
            p.cancel_rebalance(plan, state_lost=False)
        else:
            p.commit_rebalance(plan)

    def run(self, steps: int) -> None:
        ops = [self.add, self.add, self.admit, self.admit, self.prefill, self.prefill, self.decode, self.decode,
               self.suspend_resume, self.drop, self.rebalance, self.spill, self.finish]
        for _ in range(steps):
            self.d.pick(ops)()
            self.planner.check_integrity()
        for rid in list(self.planner.requests()):
            self.planner.free(rid)
        self.planner.check_integrity()
        prefix = self.planner.prefix
        prefix.drop_all_unpinned(host_too=True)
        assert not prefix.index.nodes and prefix.snap_pool.num_owned == 0
        assert self.planner.page_pool.num_owned == 0 and self.planner.slot_pool.num_owned == 0
        assert self.planner.host_page_pool.num_owned == 0 and self.planner.host_slot_pool.num_owned == 0


@pytest.mark.parametrize("seed", range(12))
def test_prefix_fuzz(seed):
    PrefixModel(random.Random(seed)).run(300)


@pytest.mark.slow
def test_prefix_fuzz_long():
    for seed in range(12, 212):
        PrefixModel(random.Random(seed)).run(1000)


def test_hits_happen_in_the_fuzz():
    """The fuzz is not vacuous: across seeds, admissions restore snapshots, snapshots are evicted, spilled
    and brought back."""
    hits = evictions = spills = host_hits = partial_hits = 0
    for seed in range(12):
        m = PrefixModel(random.Random(seed))
        m.run(300)
        partial_hits += m.partial_hits
        stats = m.planner.prefix.stats
        hits, evictions = hits + stats["hits"], evictions + stats["evictions"]
        spills, host_hits = spills + stats["spills"], host_hits + stats["host_hits"]
    assert hits > 0 and evictions > 0 and spills > 0 and host_hits > 0 and partial_hits > 0, \
        (hits, evictions, spills, host_hits, partial_hits)
