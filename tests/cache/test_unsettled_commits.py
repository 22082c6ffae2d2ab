"""The planner's unsettled verify commits (`Steps.commit_unsettled` / `settle`, for asynchronous verify): a
step commits every token it fed, the read takes the rejected drafts back; until then only its rows step
and what reads a committed length is refused, changing nothing."""
from __future__ import annotations

import numpy as np
import pytest

from hybridcache.cache import InvalidCountError, InvalidTransitionError
from hybridcache.cache.planner import Planner

T = 4  # tokens a verify row feeds (k = 3)


def generating(rows: list[str], prompt: int = 6) -> Planner:
    """A planner whose `rows` are GENERATION after a prompt of `prompt` tokens each."""
    planner = Planner(4, True, num_slots=4, num_pages=40, num_dummies=0, host_slots=4, host_pages=40)
    for r in rows:
        planner.add(r)
    assert planner.allocate(rows, prompt)
    plan = planner.plan_step(rows, prompt)
    planner.commit_step(plan, planner.check_accept(plan, None))
    for r in rows:
        planner.start_generation(r)
    return planner


def unsettled_step(planner: Planner, rows: list[str]):
    assert planner.allocate(rows, T)
    plan = planner.plan_step(rows, T)
    planner.commit_unsettled(plan)
    return plan


def counts(planner: Planner, rows: list[str]) -> list[int]:
    return [planner.entry(r).num_tokens for r in rows]


def test_two_chained_steps_settle_in_order_and_the_lengths_live_on_the_device_meanwhile():
    rows = ["a", "b"]
    planner = generating(rows)
    first = unsettled_step(planner, rows)
    assert not first.lens_on_device and counts(planner, rows) == [10, 10]
    second = unsettled_step(planner, rows)
    assert second.lens_on_device and second.cached_lens.tolist() == [10, 10]  # upper bounds
    planner.settle([2, 4])  # the first step: a kept 2 of its 4 tokens, b all
    assert counts(planner, rows) == [12, 14]
    planner.settle(np.array([1, 3]))  # the second: a kept 1, b 3
    assert counts(planner, rows) == [9, 13] and planner.unsettled == []
    third = planner.plan_step(rows, 1)
    assert not third.lens_on_device and third.cached_lens.tolist() == [9, 13]
    planner.check_integrity()


def test_what_reads_a_length_waits_for_the_settle_and_bad_counts_change_nothing():
    rows = ["a", "b"]
    planner = generating(rows + ["c"])
    unsettled_step(planner, rows)
    for refused in (lambda: planner.plan_suspend(["a"]), lambda: planner.reprefill("a"),
                    lambda: planner.plan_rebalance(3, 30), lambda: planner.plan_step(["a", "c"], 1)):
        with pytest.raises(InvalidTransitionError, match="settle"):
            refused()
    for bad in ([0, 4], [5, 1], [1, 1, 1]):
        with pytest.raises(InvalidCountError):
            planner.settle(bad)
    assert counts(planner, rows) == [10, 10] and len(planner.unsettled) == 1
    planner.settle([4, 4])
    with pytest.raises(InvalidTransitionError, match="no verify step"):
        planner.settle([1, 1])
    planner.commit_move(planner.plan_suspend(["a"]), 0)  # settled: allowed again
    planner.check_integrity()


def test_a_row_freed_or_restarted_before_the_settle_takes_nothing_back():
    rows = ["a", "b", "c"]
    planner = generating(rows)
    unsettled_step(planner, rows)
    planner.free("a")
    assert planner.allocate(["b", "c"], T)
    with pytest.raises(InvalidTransitionError, match="step together"):  # other rows: not before the settle
        planner.plan_step(["b", "c"], T)
    planner.add("a")  # a new request of the same id: not the entry the step committed for
    planner.settle([1, 2, 3])
    assert counts(planner, ["a", "b", "c"]) == [0, 8, 9]
    planner.plan_step(["b", "c"], T)  # settled: any rows again
    planner.check_integrity()


def test_only_generation_rows_without_prefix_caching_commit_unsettled():
    planner = generating(["a"])
    planner.add("new")
    assert planner.allocate(["a", "new"], [T, 3])
    plan = planner.plan_step(["a", "new"], [T, 3])
    with pytest.raises(InvalidTransitionError, match="generation rows"):
        planner.commit_unsettled(plan)
    planner.abort_step(plan)
    cached = Planner(4, True, num_slots=2, num_pages=20, num_dummies=0, host_slots=0, host_pages=0,
                     num_snapshots=2, snapshot_interval=8)
    cached.add("a")
    assert cached.allocate(["a"], 6)
    step = cached.plan_step(["a"], 6)
    cached.commit_step(step, cached.check_accept(step, None))
    cached.start_generation("a")
    assert cached.allocate(["a"], T)
    with pytest.raises(InvalidTransitionError, match="prefix caching"):
        cached.commit_unsettled(cached.plan_step(["a"], T))


def test_a_row_restarted_by_an_aborted_step_takes_nothing_back_even_generating_again():
    rows = ["a", "b"]
    planner = generating(rows)
    unsettled_step(planner, rows)  # committed: 10 each
    assert planner.allocate(rows, T)
    pending = planner.plan_step(rows, T)
    with pytest.raises(InvalidTransitionError, match="pending"):  # not while a step is pending
        planner.settle([1, 1])
    planner.abort_step(pending)  # both restart from their tokens
    assert planner.allocate(["a"], 5)
    step = planner.plan_step(["a"], 5)
    planner.commit_step(step, planner.check_accept(step, None))
    planner.start_generation("a")  # GENERATION again with 5 tokens: the same entry
    planner.settle([1, 1])
    assert counts(planner, rows) == [5, 0] and planner.unsettled == []
    planner.check_integrity()
