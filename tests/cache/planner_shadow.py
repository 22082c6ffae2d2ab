"""The shadow model of the Planner (no tensors, no store) that `test_planner_stateful.py` drives.

Every rule runs one planner operation, valid or not, and the shadow predicts its outcome: success and what
each request then holds, `allocate` returning False, or a typed error that changes nothing (a snapshot of
every entry and every pool is compared before and after). Plans are checked against the entries; a step
plan's page-table writes, applied in order to a simulated store's table (reset when `version` changes,
widened when `table_width` grows), must rebuild every row's pages exactly, writing no cell twice.

`Model` draws through a `Draw` (`planner_walk`), backed by `random.Random` for the plain random walk or by
hypothesis's `data` for the rule-based machine. The rules live by kind: steps allocated and planned in
`planner_steps`, moves planned in `planner_moves`, those that must be refused in `planner_refusals`, those
that close a pending step or move in `planner_closing`.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import strategies as st

from hybridcache.cache import (
    DoubleFreeError,
    DuplicateRequestError,
    IntegrityError,
    InvalidTransitionError,
    MovePlan,
    OutOfDeviceMemoryError,
    Planner,
    RecarvePlan,
    Status,
    StepPlan,
)
from hybridcache.cache.counts import MAX_TOKENS
from tests.cache.planner_closing import Closings
from tests.cache.planner_moves import Moves
from tests.cache.planner_refusals import Refusals
from tests.cache.planner_steps import Steps, ceil_div
from tests.cache.planner_walk import (
    CONTEXT, DUMMY, GENERATION, IDLE, MOVING, ON_DEVICE, PENDING, RECARVING, SUSPENDED, WAITING, Req,
)

STATS = ("suspensions", "resumes", "reprefills", "aborted_rows", "rebalances", "bytes_to_host", "bytes_to_device")


# ---------------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class Config:
    page_size: int
    has_pages: bool
    num_slots: int
    num_pages: int
    num_dummies: int
    host_slots: int
    host_pages: int


def random_config(rng: random.Random) -> Config:
    return Config(page_size=rng.choice([1, 2, 4]), has_pages=rng.random() < 0.85, num_slots=rng.randint(1, 5),
                  num_pages=rng.randint(0, 40), num_dummies=rng.randint(0, 2), host_slots=rng.randint(0, 4),
                  host_pages=rng.randint(0, 24))


# the first of each list is where hypothesis starts and shrinks to: a roomy configuration
CONFIGS = st.builds(Config, page_size=st.sampled_from([2, 1, 4]), has_pages=st.sampled_from([True, False]),
                    num_slots=st.sampled_from([3, 1, 2, 5]), num_pages=st.sampled_from([24, 0, 3, 8, 40]),
                    num_dummies=st.sampled_from([1, 0, 2]), host_slots=st.sampled_from([2, 0, 1, 4]),
                    host_pages=st.sampled_from([16, 0, 2, 24]))


class Model:
    """A Planner and its shadow. Each rule draws its arguments, runs the planner and checks the outcome."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.planner = Planner(cfg.page_size, cfg.has_pages, cfg.num_slots, cfg.num_pages, cfg.num_dummies,
                               cfg.host_slots, cfg.host_pages)
        self.reqs: dict[str, Req] = {}
        self.freed: set[str] = set()
        self.free_dummies = list(range(cfg.num_dummies - 1, -1, -1))
        self.num_slots, self.num_pages = cfg.num_slots, cfg.num_pages
        self.stats = dict.fromkeys(STATS, 0)
        self.refusals = Refusals(self)
        self.closings = Closings(self)
        self.steps = Steps(self)
        self.moves = Moves(self)
        self.counter = 0
        self.step: StepPlan | None = None  # the pending step
        self.move: MovePlan | RecarvePlan | None = None  # the move in progress
        self.before_move = None  # snapshot taken when the move was planned
        self.added: list[str] = []  # requests added since then (allowed during a move)
        self.last_step: StepPlan | None = None  # closed plans, to hand back stale
        self.last_move: MovePlan | RecarvePlan | None = None
        self.table = np.full((0, 1), -1, dtype=np.int64)  # the simulated store's page table
        self.version = -1
        self.key: tuple = ()
        self.outcomes: Counter = Counter()
        # verify steps committed unsettled, oldest first: ([(rid, its Req) or None once restarted], fed counts)
        self.unsettled: list[tuple[list[tuple[str, Req] | None], list[int]]] = []

    # -- queries -----------------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        if self.step is not None:
            return PENDING
        if isinstance(self.move, MovePlan):
            return MOVING
        if isinstance(self.move, RecarvePlan):
            return RECARVING
        return IDLE

    def ids(self, *statuses: Status) -> list[str]:
        return [r for r, q in self.reqs.items() if q.status in statuses]

    def live_pages(self, q: Req) -> int:
        return ceil_div(q.tokens, self.cfg.page_size) if self.cfg.has_pages else 0

    def growth(self, rid: str, n: int) -> int:
        q = self.reqs[rid]
        if q.status == DUMMY or not self.cfg.has_pages:
            return 0
        return max(0, ceil_div(q.tokens + n, self.cfg.page_size) - q.pages)

    def expected_free(self) -> tuple[int, int, int, int]:
        live = [q for q in self.reqs.values() if q.status in ON_DEVICE]
        held = [q for q in self.reqs.values() if q.status == SUSPENDED]
        free = [self.num_slots - len(live), self.num_pages - sum(q.pages for q in live),
                self.cfg.host_slots - len(held), self.cfg.host_pages - sum(q.host_pages for q in held)]
        if isinstance(self.move, MovePlan):  # reserved for the copy
            at = 2 if self.move.to_host else 0
            m = self.move
            slots, pages = (m.host_slots, m.host_pages) if m.to_host else (m.slots, m.pages)
            free[at] -= len(slots)
            free[at + 1] -= len(pages)
        return tuple(free)

    def snapshot(self):
        p = self.planner
        entries = [(r, e.status, e.slot, tuple(e.pages), e.host_slot, tuple(e.host_pages), e.num_tokens, e.fresh)
                   for r, e in ((r, p.entry(r)) for r in p.requests())]
        pools = [(q.total, q.num_free, tuple(q.owned_ids()))
                 for q in (p.slot_pool, p.page_pool, p.host_slot_pool, p.host_page_pool)]
        return entries, pools, tuple(p.free_dummy_slots), id(p.pending), dict(p.stats)

    def refused(self, error: type[BaseException] | tuple, call: Callable[[], object]) -> None:
        """The call raises `error` and changes nothing."""
        before = self.snapshot()
        with pytest.raises(error) as info:
            call()
        assert self.snapshot() == before
        self.outcomes["refused"] += 1
        self.outcomes[f"refused {type(info.value).__name__}"] += 1

    def assert_as_planned(self) -> None:
        """A cancelled move left everything as it was when planned, but for the requests added since."""
        entries, pools, dummies, _, stats = self.snapshot()
        entries = [x for x in entries if x[0] not in self.added]
        dummies += tuple(self.reqs[r].dummy_slot for r in reversed(self.added) if self.reqs[r].status == DUMMY)
        before_entries, before_pools, before_dummies, _, before_stats = self.before_move
        assert (entries, pools, dummies, stats) == (before_entries, before_pools, before_dummies, before_stats)

    # -- the invariant -----------------------------------------------------------------------------
    def check(self) -> None:
        p = self.planner
        assert p.requests() == list(self.reqs)
        for rid, q in self.reqs.items():
            e = p.entry(rid)
            got = (e.status, e.num_tokens, len(e.pages), len(e.host_pages), e.fresh)
            assert got == (q.status, q.tokens, q.pages, q.host_pages, q.fresh), (rid, got, q)
            assert (e.slot >= 0) == (q.status in (*ON_DEVICE, DUMMY))
            assert (e.host_slot >= 0) == (q.status == SUSPENDED)
            if q.status == DUMMY:
                assert e.slot == q.dummy_slot
            want = 0 if q.status == DUMMY else self.growth(rid, 1)
            assert p.pages_needed(rid, 1) == want
        pools = (p.slot_pool.num_free, p.page_pool.num_free, p.host_slot_pool.num_free, p.host_page_pool.num_free)
        assert pools == self.expected_free()
        assert (p.num_slots, p.num_pages) == (self.num_slots, self.num_pages)
        assert p.free_dummy_slots == self.free_dummies
        assert {k: p.stats[k] for k in STATS} == self.stats
        live = [q for q in self.reqs.values() if q.status in ON_DEVICE]
        assert p.live_counts() == (len(live), sum(q.pages for q in live))
        assert p.pending is self.step
        if self.phase in (MOVING, RECARVING):
            with pytest.raises(IntegrityError, match="half done"):
                p.check_integrity()
        else:
            p.check_integrity()

    # -- drawing arguments -------------------------------------------------------------------------
    def count_for(self, d, rid: str) -> int:
        q = self.reqs[rid]
        if not self.cfg.has_pages and q.tokens < MAX_TOKENS and d.int(0, 19) == 19:
            return MAX_TOKENS - q.tokens - d.int(0, 1) or 1  # near the int32 limit (no pages to run out of)
        return d.int(1, 4) if q.status == GENERATION else d.int(1, 3 * self.cfg.page_size + 1)

    def counts_for(self, d, rows: list[str]):
        """Per-row counts, as an int (one for all rows), a list or an array; returns (argument, [B] ints)."""
        n = [self.count_for(d, r) for r in rows]
        form = d.int(0, 9)
        if form > 7 and rows:
            return n[0], [n[0]] * len(rows)
        if form == 7:
            return np.array(n, dtype=np.int64), n
        return n, n

    def bad_counts(self, d, rows: list[str]):
        """An argument `_counts` must refuse for `rows` with InvalidCountError."""
        b = len(rows)
        choices = [True, [1] * (b + 1)]  # with no rows, any int broadcasts to nothing and is fine
        if b:
            choices += [0, -1, MAX_TOKENS + 1, 2**70, [1] * (b - 1) + [0], [1.5] * b, [True] * b,
                        np.ones(b, dtype=np.float32), [2**70] * b]
        return choices[d.int(0, len(choices) - 1)]

    # -- rules: any phase --------------------------------------------------------------------------
    def add(self, d) -> None:
        roll = d.int(0, 9)  # rare branches at the top: hypothesis favours small values
        if roll == 9 and self.reqs:
            rid = d.pick(list(self.reqs))
            return self.refused(DuplicateRequestError, lambda: self.planner.add(rid))
        if roll == 8 and self.freed:
            rid = d.pick(sorted(self.freed))
        else:
            self.counter += 1
            rid = f"r{self.counter}"
        self.planner.add(rid)
        self.freed.discard(rid)
        self.reqs[rid] = Req(WAITING)
        self.added.append(rid)

    def add_dummy(self, d) -> None:
        if d.int(0, 9) == 9 and self.reqs:
            rid = d.pick(list(self.reqs))
            return self.refused(DuplicateRequestError, lambda: self.planner.add_dummy(rid))
        self.counter += 1
        rid = f"pad{self.counter}"
        if not self.free_dummies:
            return self.refused(OutOfDeviceMemoryError, lambda: self.planner.add_dummy(rid))
        assert self.planner.add_dummy(rid) == self.free_dummies[-1]
        self.reqs[rid] = Req(DUMMY, dummy_slot=self.free_dummies.pop())
        self.added.append(rid)

    def start_generation(self, d) -> None:
        rid = d.pick(self.ids(CONTEXT))
        self.planner.start_generation(rid)
        self.reqs[rid].status = GENERATION

    def reprefill(self, d) -> None:
        rid = d.pick(self.ids(CONTEXT, GENERATION, SUSPENDED))
        if self.unsettled:  # it reads committed lengths: not before the settle
            return self.refused(InvalidTransitionError, lambda: self.planner.reprefill(rid))
        self.planner.reprefill(rid)
        self.reqs[rid] = Req(WAITING)
        self.stats["reprefills"] += 1

    def free(self, d) -> None:
        rid = d.pick(list(self.reqs))
        self.planner.free(rid)
        q = self.reqs.pop(rid)
        if q.status == DUMMY:
            self.free_dummies.append(q.dummy_slot)
        self.freed.add(rid)
        with pytest.raises(DoubleFreeError):
            self.planner.entry(rid)

    # -- rules: what must be refused (`planner_refusals.Refusals`) --------------------------------------
    def invalid(self, d) -> None:
        self.refusals.invalid(d)

    # -- which rules apply -------------------------------------------------------------------------
    def rules(self) -> list[tuple[int, Callable]]:
        """(weight, rule) of the rules that apply in this phase; the ones that move a lifecycle on come
        first (hypothesis draws towards the front)."""
        always = [(8 if len(self.reqs) < 12 else 1, self.add), (1, self.add_dummy), (6, self.invalid)]
        phase = self.phase
        if phase != IDLE:
            c = self.closings
            finish = {PENDING: c.finish_step, MOVING: c.finish_move, RECARVING: c.finish_rebalance}[phase]
            return [(60, finish)] + always
        out = []
        if self.ids(WAITING, CONTEXT, GENERATION, DUMMY):
            out += [(20, self.steps.decode), (20, self.steps.allocate_and_plan)]
        if self.ids(CONTEXT):
            out.append((8, self.start_generation))
        if self.ids(GENERATION):
            out.append((6, self.moves.suspend))
        if self.ids(SUSPENDED):
            out.append((12, self.moves.resume))
        full = 1 - self.expected_free()[1] / max(self.num_pages, 1)  # under pressure, requests end more often
        if self.ids(CONTEXT, GENERATION, SUSPENDED):
            out.append((2 + int(6 * full), self.reprefill))
        if self.reqs:
            out.append((4 + int(12 * full), self.free))
        if self.unsettled:
            out.append((12, self.closings.settle))
        return out + [(3, self.steps.allocate), (6, self.steps.plan_only), (3, self.moves.rebalance)] + always
