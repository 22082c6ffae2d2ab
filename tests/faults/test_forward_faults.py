"""A forward that raises in its first, middle or last decoder layer — each family, plain and with n-gram
speculation, under memory pressure. The failing layer runs first (its writes land) and then raises, so the
step's rows hold state the failed step touched: they must restart from their tokens, never run again on it.

After the fault: `check_integrity()` holds, every unfinished request is queued once, and stepping on gives
exactly the tokens of an undisturbed run with no id leaked; `generate` raises, aborts its requests, and the
same LLM serves the next `generate` exactly."""
from __future__ import annotations

import pytest

from .helpers import (
    FAMILIES, PROMPTS, SPEC, FailOnCall, Injected, add_all, assert_clean, assert_queued_once, build,
    greedy_and_sampled, step_to_end, step_until_raises, tokens,
)

POSITIONS = {"first": lambda n: 0, "middle": lambda n: n // 2, "last": lambda n: n - 1}
SPECS = {"plain": None, "ngram": SPEC}


def fail_layer(llm, monkeypatch, position: str, nth: int, exc: type[BaseException] = Injected) -> FailOnCall:
    """Make one decoder layer instance raise `exc` on its `nth` call (`residual`, what the trunk calls), after
    running it."""
    layers = llm.model.trunk.layers
    layer = layers[POSITIONS[position](len(layers))]
    fault = FailOnCall(layer.residual, nth, exc, after=True)
    monkeypatch.setattr(layer, "residual", fault)
    return fault


@pytest.mark.parametrize("nth", [2, 9])  # a step of fresh context and generation rows; one after preemptions
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_failed_layer_restarts_the_step_and_the_run_ends_undisturbed(
    checkpoint, reference, monkeypatch, family, position, spec, nth
):
    params = greedy_and_sampled()
    llm = build(checkpoint(family), SPECS[spec], pressure=True)
    fault = fail_layer(llm, monkeypatch, position, nth)
    rids = add_all(llm, PROMPTS, params)
    outputs: dict[int, list[int]] = {}
    step_until_raises(llm, outputs)
    assert fault.fired == 1
    llm.manager.check_integrity()
    assert not llm.manager.has_pending_step
    assert llm.stats.num_aborted_rows > 0
    assert_queued_once(llm, [r for r in rids if r not in outputs])
    step_to_end(llm, outputs)
    assert [outputs[r] for r in rids] == reference(family, SPECS[spec], params)
    assert_clean(llm)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("family", FAMILIES)
def test_generate_raises_and_the_same_llm_serves_the_next_generate_exactly(
    checkpoint, reference, monkeypatch, family, spec
):
    params = greedy_and_sampled()
    llm = build(checkpoint(family), SPECS[spec], pressure=True)
    fault = fail_layer(llm, monkeypatch, "middle", 4)
    with pytest.raises(Injected):
        llm.generate(PROMPTS, params)
    assert fault.fired == 1
    assert_clean(llm)
    assert tokens(llm.generate(PROMPTS, params)) == reference(family, SPECS[spec], params)
    assert_clean(llm)


@pytest.mark.parametrize("family", FAMILIES)
def test_ctrl_c_inside_a_layer_aborts_generate_and_the_llm_stays_usable(checkpoint, reference, monkeypatch, family):
    params = greedy_and_sampled()
    llm = build(checkpoint(family), SPEC, pressure=True)
    fail_layer(llm, monkeypatch, "middle", 5, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, params)
    assert_clean(llm)
    assert tokens(llm.generate(PROMPTS, params)) == reference(family, SPEC, params)
