"""The Planner against its shadow model (`planner_shadow.Model`), by random walks and a hypothesis machine.

One set of rules, two drivers: the plain random walk (`random.Random`: many operations, cheap) and the
rule-based machine (hypothesis's `data`: shrinking). The shadow is checked after every rule.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hybridcache.cache import (
    DoubleFreeError,
    DuplicateRequestError,
    HostTierFullError,
    InvalidCountError,
    InvalidTransitionError,
    OutOfDeviceMemoryError,
    UnknownRequestError,
)
from tests.cache.planner_shadow import CONFIGS, Config, Model, random_config
from tests.cache.planner_walk import DataDraw, RandomDraw


def walk(seed: int, ops: int, **config) -> Counter:
    """`ops` random rules on a random configuration (`config` overrides fields), the shadow checked after
    each; returns the outcomes."""
    rng = random.Random(seed)
    model = Model(dataclasses.replace(random_config(rng), **config))
    draw = RandomDraw(rng)
    model.check()
    for _ in range(ops):
        weights, rules = zip(*model.rules())
        rng.choices(rules, weights)[0](draw)
        model.check()
    return model.outcomes


def check_coverage(outcomes: Counter, at_least: int) -> None:
    """A walk that never reached a state would pass while proving nothing."""
    errors = (OutOfDeviceMemoryError, InvalidTransitionError, InvalidCountError, DuplicateRequestError,
              HostTierFullError, ValueError, DoubleFreeError, UnknownRequestError)
    for what in ("plan", "commit", "abort", "layout reused", "allocate refused", "suspend", "resume", "cancel move",
                 "rebalance", "cancel rebalance", "rebalance lost", "past int32", "commit unsettled", "settle",
                 *(f"refused {e.__name__}" for e in errors)):
        assert outcomes[what] >= at_least, (what, outcomes)


def test_random_walk():
    outcomes = sum((walk(seed, 500, has_pages=seed % 3 > 0) for seed in range(6)), Counter())  # 3,000 rules
    check_coverage(outcomes, 1)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(4))
def test_random_walk_long(chunk):
    outcomes = sum((walk(1000 + 10 * chunk + seed, 2_500) for seed in range(10)), Counter())  # 4 x 25,000 rules
    check_coverage(outcomes, 10)


# ---------------------------------------------------------------------------------------------- hypothesis
class PlannerMachine(RuleBasedStateMachine):
    """The same rules, drawn by hypothesis, which shrinks a failure to a short sequence of named rules.

    One hypothesis rule picks among the model's rules that apply, weighted as in the walk: separate
    hypothesis rules behind preconditions would each be switched off in many examples (swarm testing),
    and a request rarely got as far as GENERATION, let alone SUSPENDED."""

    @initialize(cfg=CONFIGS)
    def start(self, cfg: Config) -> None:
        self.model = Model(cfg)

    @rule(data=st.data())
    def act(self, data) -> None:
        weights, rules = zip(*self.model.rules())
        at = data.draw(st.integers(0, sum(weights) - 1), label="rule")
        chosen = next(r for r, top in zip(rules, itertools.accumulate(weights)) if at < top)
        note(f"rule: {chosen.__name__}")
        chosen(DataDraw(data))

    @invariant()
    def consistent(self) -> None:
        self.model.check()


def run_machine(examples: int, steps: int) -> None:
    PlannerMachine.TestCase.settings = settings(
        max_examples=examples, stateful_step_count=steps, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    PlannerMachine.TestCase().runTest()


def test_planner_machine():
    run_machine(examples=50, steps=50)


@pytest.mark.slow
def test_planner_machine_long():
    run_machine(examples=500, steps=100)
