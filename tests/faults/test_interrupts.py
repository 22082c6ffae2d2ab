"""Ctrl-C in `generate`, under memory pressure with speculation (suspensions, resumes, re-prefills).

At random moments: a timer thread interrupts the main thread at a delay drawn from the length of an
undisturbed `generate`. At chosen moments: a SIGINT sent from inside the engine's bookkeeping (queueing the
requests, committing a step, suspending a request), where it is held and raised when the section ends.
After each: integrity holds, nothing is held (generate aborted its requests), and the same LLM's next
`generate` gives exactly the undisturbed tokens."""
from __future__ import annotations

import random
import signal
import time

import pytest

from .helpers import (
    FAMILIES, PROMPTS, SPEC, CtrlCOnCall, add_all, assert_clean, build, greedy_and_sampled, interrupt_during,
    step_to_end, step_until_raises, tokens,
)


def random_interrupts(path, trials: int, seed: int) -> None:
    params = greedy_and_sampled()
    llm = build(path, SPEC, pressure=True)
    expected = tokens(llm.generate(PROMPTS, params))
    s = llm.stats
    assert s.num_suspensions > 0 and s.num_resumes > 0 and s.num_reprefills > 0, s
    start = time.perf_counter()
    assert tokens(llm.generate(PROMPTS, params)) == expected
    duration = time.perf_counter() - start
    rng = random.Random(seed)
    mid_run = 0
    for _ in range(trials):
        steps = llm.stats.num_steps
        outs, hit = interrupt_during(lambda: llm.generate(PROMPTS, params), rng.uniform(0, duration))
        if hit:
            mid_run += llm.stats.num_steps > steps  # at least one step ran before the interrupt
        else:
            assert tokens(outs) == expected
        assert_clean(llm)
        assert tokens(llm.generate(PROMPTS, params)) == expected
        assert_clean(llm)
    assert mid_run >= min(5, trials // 4), f"only {mid_run} of {trials} interrupts landed inside a run"


def test_ctrl_c_at_random_moments_of_generate(checkpoint):
    random_interrupts(checkpoint("nemotron_h"), trials=40, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_ctrl_c_at_many_random_moments_of_generate(checkpoint, family):
    random_interrupts(checkpoint(family), trials=200, seed=1)


@pytest.mark.parametrize("where", ["queueing", "commit", "suspend"])
def test_ctrl_c_held_by_a_bookkeeping_section_aborts_generate_cleanly(checkpoint, reference, monkeypatch, where):
    params = greedy_and_sampled()
    expected = reference("nemotron_h", SPEC, params)
    llm = build(checkpoint("nemotron_h"), SPEC, pressure=True)
    target, name, nth = {
        "queueing": (llm.scheduler, "add", 3),  # generate has queued 3 of its requests
        "commit": (llm.manager.planner, "commit_step", 4),  # a step's tokens are committed, its requests not advanced
        "suspend": (llm.manager, "suspend", 1),  # inside the scheduler, while it preempts
    }[where]
    hook = CtrlCOnCall(getattr(target, name), nth)
    monkeypatch.setattr(target, name, hook)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, params)
    assert hook.calls >= nth
    monkeypatch.undo()
    assert_clean(llm)
    assert tokens(llm.generate(PROMPTS, params)) == expected
    assert_clean(llm)


def test_ctrl_c_after_a_commit_that_finished_requests_loses_no_output(checkpoint, reference):
    """With `step()`, a Ctrl-C held through the commit of a step that finished requests is raised after the
    commit; those outputs come back from the next `step()`, and every request ends exact."""
    params = greedy_and_sampled()
    expected = reference("nemotron_h", SPEC, params)
    llm = build(checkpoint("nemotron_h"), SPEC, pressure=True)
    rids = add_all(llm, PROMPTS, params)
    real, outputs, fired = llm._loop._advance, {}, []

    def advance_then_ctrl_c(*args):
        finished = real(*args)
        if finished and not fired:
            fired.append([o.request_id for o in finished])
            signal.raise_signal(signal.SIGINT)
        return finished

    llm._loop._advance = advance_then_ctrl_c
    step_until_raises(llm, outputs, exc=KeyboardInterrupt)
    assert fired and not set(fired[0]) & set(outputs)  # the step raised: its outputs were not returned yet
    step_to_end(llm, outputs)
    assert [outputs[r] for r in rids] == expected
    assert_clean(llm)
