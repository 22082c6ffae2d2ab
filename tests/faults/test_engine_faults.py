"""Faults outside the forward: the sampler (mid-step, after other rows drew), the drafter, the accept hooks, a
`progress` callback, a suspend or resume copy under memory pressure, and a rebalance whose copy back fails
(restored) or whose restore fails too (state lost), inside the scheduler and through `LLM.rebalance`. Each
leaves integrity, the queues and the random draws as an undisturbed run would have them: stepping on gives
exactly its tokens."""
from __future__ import annotations

import pytest

import hybridcache.cache.copy_engine as copy_engine
import hybridcache.engine.step_tokens as step_tokens
from hybridcache.cache import StateLostError, Status
from tests.cache.factory import assert_same_state

from .helpers import (
    PROMPTS, SPEC, FailOnCall, Injected, add_all, assert_clean, assert_queued_once, build, greedy_and_sampled,
    sampled, step_to_end, step_until_raises, tokens,
)

SPECS = {"plain": None, "ngram": SPEC}
FAMILY = "qwen3_next"


def run_with_fault(llm, params, expected: list[list[int]], exc: type[BaseException] = Injected) -> None:
    """Add the workload, step until the injected fault raises, check the aftermath, step to the end and compare
    with the undisturbed run's tokens (computed before the fault was installed)."""
    rids = add_all(llm, PROMPTS, params)
    outputs: dict[int, list[int]] = {}
    step_until_raises(llm, outputs, exc)
    llm.manager.check_integrity()
    assert not llm.manager.has_pending_step
    assert_queued_once(llm, [r for r in rids if r not in outputs])
    step_to_end(llm, outputs)
    assert [outputs[r] for r in rids] == expected
    assert_clean(llm)


# a step's sampling fails after the forward ran; the step replays with the same counter-based draws
@pytest.mark.parametrize("nth", [5, 11])
@pytest.mark.parametrize("spec", SPECS)
def test_a_sampler_fault_replays_the_same_random_draws(checkpoint, reference, monkeypatch, spec, nth):
    params = sampled()
    expected = reference(FAMILY, SPECS[spec], params)
    llm = build(checkpoint(FAMILY), SPECS[spec], pressure=True)
    fault = FailOnCall(step_tokens.sample, nth)
    monkeypatch.setattr(step_tokens, "sample", fault)
    run_with_fault(llm, params, expected)
    assert fault.fired == 1


@pytest.mark.parametrize("nth", [1, 6])
def test_a_drafter_fault_changes_nothing(checkpoint, reference, monkeypatch, nth):
    params = greedy_and_sampled()
    expected = reference(FAMILY, SPEC, params)
    llm = build(checkpoint(FAMILY), SPEC, pressure=True)
    fault = FailOnCall(llm.drafter.propose, nth)
    monkeypatch.setattr(llm.drafter, "propose", fault)
    run_with_fault(llm, params, expected)
    assert fault.fired == 1


@pytest.mark.parametrize("spec", SPECS)
def test_a_fault_in_the_accept_hooks_restarts_the_step(checkpoint, reference, monkeypatch, spec):
    """The state modules' accept bookkeeping runs (PNAT, buffer flips are written) and then raises."""
    params = greedy_and_sampled()
    expected = reference(FAMILY, SPECS[spec], params)
    llm = build(checkpoint(FAMILY), SPECS[spec], pressure=True)
    fault = FailOnCall(llm.manager.store.accept, 3, after=True)
    monkeypatch.setattr(llm.manager.store, "accept", fault)
    run_with_fault(llm, params, expected)
    assert fault.fired == 1 and llm.stats.num_aborted_rows > 0


@pytest.mark.parametrize("nth", [1, 7])
def test_a_progress_callback_that_raises_aborts_generate_and_the_llm_stays_usable(checkpoint, reference, nth):
    params = greedy_and_sampled()
    llm = build(checkpoint(FAMILY), SPEC, pressure=True)
    progress = FailOnCall(lambda done, total: None, nth)
    with pytest.raises(Injected):
        llm.generate(PROMPTS, params, progress=progress)
    assert progress.fired == 1
    assert_clean(llm)
    assert tokens(llm.generate(PROMPTS, params)) == reference(FAMILY, SPEC, params)
    assert_clean(llm)


@pytest.mark.parametrize("copy", ["_pack", "_scatter"], ids=["suspend", "resume"])
@pytest.mark.parametrize("spec", SPECS)
def test_a_copy_fault_under_memory_pressure_keeps_every_request_queued(checkpoint, reference, monkeypatch, spec, copy):
    """The split is fixed, so every pack is a suspend and every scatter a resume; the 2nd call is the page
    copy of the first one, after its slot rows moved."""
    params = greedy_and_sampled()
    expected = reference(FAMILY, SPECS[spec], params)
    llm = build(checkpoint(FAMILY), SPECS[spec], pressure=True)
    fault = FailOnCall(getattr(copy_engine, copy), 2)
    monkeypatch.setattr(copy_engine, copy, fault)
    run_with_fault(llm, params, expected)
    assert fault.fired == 1
    assert llm.stats.num_suspensions > 0 and llm.stats.num_resumes > 0


class FailingRecarve:
    """The store's first re-carve fails from its copy back's 2nd scatter on: once (the old carving is
    restored), or for good (`double`: the restore fails too, StateLostError)."""

    def __init__(self, store, double: bool) -> None:
        self.real, self.double, self.fired = store.recarve, double, False

    def __call__(self, plan):
        if self.fired:
            return self.real(plan)
        self.fired = True
        scatter = copy_engine._scatter
        copy_engine._scatter = FailOnCall(scatter, 2, times=None if self.double else 1)
        try:
            return self.real(plan)
        finally:
            copy_engine._scatter = scatter


@pytest.mark.parametrize("double", [False, True], ids=["restored", "state-lost"])
def test_a_failed_demand_rebalance_keeps_every_request_queued(checkpoint, reference, monkeypatch, double):
    """The split follows demand: a rebalance inside the scheduler fails; its live requests keep their state
    (restored) or restart from their tokens (state lost), and the run ends as an undisturbed one."""
    params = greedy_and_sampled()
    expected = reference(FAMILY, SPEC, params, fixed_split=False)
    llm = build(checkpoint(FAMILY), SPEC, pressure=True, fixed_split=False)
    fault = FailingRecarve(llm.manager.store, double)
    monkeypatch.setattr(llm.manager.store, "recarve", fault)
    run_with_fault(llm, params, expected, StateLostError if double else Injected)
    assert fault.fired and llm.stats.num_rebalances > 0


@pytest.mark.parametrize("double", [False, True], ids=["restored", "state-lost"])
def test_a_failed_llm_rebalance_keeps_every_request_queued(checkpoint, reference, monkeypatch, double):
    params = greedy_and_sampled()
    expected = reference(FAMILY, SPEC, params)
    llm = build(checkpoint(FAMILY), SPEC, pressure=True)
    rids = add_all(llm, PROMPTS, params)
    outputs: dict[int, list[int]] = {}
    for _ in range(4):
        outputs.update((o.request_id, o.token_ids) for o in llm.step())
    live = [r for r in rids if llm.manager.status(r) == Status.GENERATION]
    assert live
    states = {r: llm.manager.live_state(r) for r in live}
    monkeypatch.setattr(llm.manager.store, "recarve", FailingRecarve(llm.manager.store, double))
    with pytest.raises(StateLostError if double else Injected):
        llm.rebalance(3)
    llm.manager.check_integrity()
    assert llm.manager.num_slots == 4
    assert_queued_once(llm, [r for r in rids if r not in outputs])
    for r in live:
        if double:
            assert llm.manager.status(r) == Status.WAITING and r in [q.req_id for q in llm.scheduler.waiting]
        else:
            assert_same_state(states[r], llm.manager.live_state(r))
    llm.rebalance(3)  # the fault fired once: the same re-split now succeeds
    assert llm.manager.num_slots == 3
    step_to_end(llm, outputs)
    assert [outputs[r] for r in rids] == expected
    assert_clean(llm)
