"""The planner walk's refusal rules (`planner_shadow.Model.invalid`): in each phase, calls that must
raise a typed error and change nothing — unknown, freed or twice-listed requests, bad counts, statuses an
operation does not take, stale plans, anything while a step is pending or a move is in progress. Each rule
picks one case and hands it to the model's `refused`, which compares every entry and pool before and after."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from hybridcache.cache import (
    DoubleFreeError,
    InvalidCountError,
    InvalidTransitionError,
    MovePlan,
    OutOfDeviceMemoryError,
    UnknownRequestError,
)
from tests.cache.planner_walk import CONTEXT, DUMMY, GENERATION, IDLE, PENDING, SUSPENDED, WAITING


class Refusals:
    """Rules over `m`, the shadow model (its planner, requests, pending plans and `refused`)."""

    def __init__(self, m) -> None:
        self.m = m

    def invalid(self, d) -> None:
        idle = self.invalid_unsettled if self.m.unsettled else self.invalid_idle
        {IDLE: idle, PENDING: self.invalid_pending}.get(self.m.phase, self.not_idle)(d)

    def invalid_unsettled(self, d) -> None:
        """A verify step is committed unsettled: what reads a committed length is refused before anything
        else (even for an unknown request), and a settle with counts that do not fit changes nothing."""
        p, m = self.m.planner, self.m
        fed = m.unsettled[0][1]
        rid = d.pick(list(m.reqs) or ["nope"])
        calls = [lambda: p.plan_suspend(m.ids(GENERATION)[:1]), lambda: p.plan_resume(m.ids(SUSPENDED)[:1]),
                 lambda: p.plan_rebalance(m.num_slots, m.num_pages), lambda: p.reprefill(rid)]
        if d.int(0, 2) == 2:
            bad = d.pick([[1] * (len(fed) + 1), [k + 1 for k in fed] or [1], [0] * len(fed) or [1, 1]])
            return m.refused(InvalidCountError, lambda: p.settle(bad))
        m.refused(InvalidTransitionError, calls[d.int(0, len(calls) - 1)])

    def invalid_idle(self, d) -> None:
        p = self.m.planner
        known = list(self.m.reqs)
        gone = sorted(self.m.freed)
        pages = d.int(0, 50)
        cases: list[tuple] = [
            (UnknownRequestError, self.call_with(d, "nope")),
            (OutOfDeviceMemoryError, lambda: p.plan_rebalance(0, pages)),
        ]
        if gone:
            cases.append((DoubleFreeError, self.call_with(d, d.pick(gone))))
        if not self.m.free_dummies:
            cases.append((OutOfDeviceMemoryError, lambda: p.add_dummy("one too many")))
        if known:
            twice = [d.pick(known)] * 2
            entry_point = d.pick([p.allocate, p.plan_step])
            cases.append((ValueError, lambda: entry_point(twice, 1)))  # a row listed twice
            some = d.subset(self.m.ids(WAITING, CONTEXT, GENERATION, DUMMY), 0)
            bad = self.m.bad_counts(d, some)
            cases.append((InvalidCountError, lambda: p.allocate(some, bad)))
            placed = d.subset(self.m.ids(CONTEXT, GENERATION, DUMMY), 0)
            bad_too = self.m.bad_counts(d, placed)
            cases.append((InvalidCountError, lambda: p.plan_step(placed, bad_too)))
        if self.m.ids(SUSPENDED):
            held = d.pick(self.m.ids(SUSPENDED))
            cases.append((InvalidTransitionError, lambda: p.allocate([held], 1)))
        for statuses, call in (  # requests in a status the operation does not take
            ((WAITING, SUSPENDED), lambda r: p.plan_step([r], 1)),
            ((WAITING, CONTEXT, SUSPENDED, DUMMY), lambda r: p.plan_suspend([r])),
            ((WAITING, CONTEXT, GENERATION, DUMMY), lambda r: p.plan_resume([r])),
            ((WAITING, DUMMY), p.reprefill),
            ((WAITING, GENERATION, SUSPENDED, DUMMY), p.start_generation),
        ):
            if self.m.ids(*statuses):
                rid = d.pick(self.m.ids(*statuses))
                cases.append((InvalidTransitionError, lambda call=call, rid=rid: call(rid)))
        cases += [(InvalidTransitionError, c) for c in self.stale_calls()]
        error, call = cases[d.int(0, len(cases) - 1)]
        self.m.refused(error, call)

    def call_with(self, d, rid: str) -> Callable[[], object]:
        """A call naming `rid` (unknown or freed): every entry point looks it up first."""
        p = self.m.planner
        calls = [lambda: p.allocate([rid], 1), lambda: p.plan_step([rid], 1), lambda: p.plan_suspend([rid]),
                 lambda: p.plan_resume([rid]), lambda: p.free(rid), lambda: p.reprefill(rid),
                 lambda: p.start_generation(rid), lambda: p.entry(rid)]
        return calls[d.int(0, len(calls) - 1)]

    def stale_calls(self) -> list[Callable[[], object]]:
        """Plans that are not the pending step or the move in progress, handed back."""
        p = self.m.planner
        step = self.m.step or self.m.last_step
        move = self.m.move or self.m.last_move
        calls: list = []
        if step is not None:
            copy = dataclasses.replace(step)
            calls += [lambda: p.check_accept(copy, None), lambda: p.abort_step(copy), lambda: p.commit_unsettled(copy)]
            if self.m.step is None:
                calls.append(lambda: p.check_accept(step, None))
        if move is not None:
            copy = dataclasses.replace(move)
            if isinstance(move, MovePlan):
                calls += [lambda: p.commit_move(copy, 0), lambda: p.cancel_move(copy)]
            else:
                calls += [lambda: p.commit_rebalance(copy), lambda: p.cancel_rebalance(copy, state_lost=True)]
        return calls

    def invalid_pending(self, d) -> None:
        p, plan = self.m.planner, self.m.step
        gen = np.flatnonzero(plan.generation).tolist()
        roll = d.int(0, 3)
        if roll == 0 and gen:
            valid = plan.num_new.copy()
            i = d.pick(gen)
            valid[i] = d.pick([0, -1, int(plan.num_new[i]) + 1])
            return self.m.refused(InvalidCountError, lambda: p.check_accept(plan, valid.tolist()))
        if roll == 1:
            wrong = [1] * (plan.batch_size + (d.pick([-1, 1]) if plan.batch_size else 1))
            return self.m.refused(InvalidCountError, lambda: p.check_accept(plan, wrong))
        if roll == 2:
            accept = p.check_accept(plan, None)
            copy = dataclasses.replace(plan)
            return self.m.refused(InvalidTransitionError, d.pick([lambda: p.commit_step(copy, accept),
                                                                 lambda: p.abort_step(copy)]))
        self.not_idle(d)

    def not_idle(self, d) -> None:
        """While a step is pending or a move is in progress, every other operation is refused."""
        p = self.m.planner
        known = list(self.m.reqs) or ["nope"]
        rid = d.pick(known)
        calls = [lambda: p.allocate([rid], 1), lambda: p.plan_step([rid], 1), lambda: p.reprefill(rid),
                 lambda: p.free(rid), lambda: p.plan_suspend(self.m.ids(GENERATION)[:1]),
                 lambda: p.plan_resume(self.m.ids(SUSPENDED)[:1]),
                 lambda: p.plan_rebalance(self.m.num_slots, self.m.num_pages)]
        if self.m.ids(CONTEXT):
            ctx = d.pick(self.m.ids(CONTEXT))
            calls.append(lambda: p.start_generation(ctx))
        if self.m.unsettled:
            calls.append(lambda: p.settle(self.m.unsettled[0][1]))
        if self.m.phase != PENDING:
            calls += self.stale_calls()
        self.m.refused(InvalidTransitionError, calls[d.int(0, len(calls) - 1)])
