"""The defects of issue 8, one test each (every one fails at 0b5e9ee):

- `accept()` took a float count (truncated), died with OverflowError on a count past int64, and
  `prepare_step()` took 0 new tokens, whose row then committed whatever count `accept()` was given;
- an exception between the forward and `accept()` (the sampler) left a prepared step behind, and every later
  step raised;
- `LLM.rebalance(n)` re-carved to a split with fewer pages than the longest known request needs, stranding it.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hybridcache.engine.step_tokens as step_tokens
from hybridcache import LLM, SamplingParams
from hybridcache.cache import BudgetTooSmallError, InvalidCountError, Status
from tests.cache.factory import assert_same_state, fill_random, make_manager, run_to_generation

from .helpers import PROMPTS, FailOnCall, step_to_end, step_until_raises, tokens

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


def two_generating(kind: str = "gdn"):
    """A manager with "a" (9 tokens) and "b" (5) generating, random bytes in every role."""
    mgr = make_manager(kind)
    gen = torch.Generator().manual_seed(8)
    for rid, n in (("a", 9), ("b", 5)):
        run_to_generation(mgr, rid, n)
        fill_random(mgr, rid, gen)
    return mgr


@pytest.mark.parametrize("counts", [
    [0, 4], [2, 5], [2**70, 1], np.array([2**63, 1], dtype=np.uint64), [1.0, 4], [1.5, 2], np.array([True, True]),
    [True, 1],
], ids=["zero", "past-num-new", "2**70", "uint64-past-int64", "float", "fraction", "bool", "bool-among-ints"])
def test_accept_refuses_a_bad_count_and_changes_nothing(counts):
    mgr = two_generating()
    mgr.prepare_step(["a", "b"], 4)
    before = {r: (mgr.entry(r).num_tokens, mgr.live_state(r)) for r in "ab"}
    with pytest.raises(InvalidCountError):
        mgr.accept(counts)
    assert isinstance(InvalidCountError("x"), ValueError)
    for r in "ab":
        assert mgr.entry(r).num_tokens == before[r][0]
        assert_same_state(before[r][1], mgr.live_state(r))
    mgr.accept([2, 4])  # the step is still pending: good counts close it
    assert [mgr.entry(r).num_tokens for r in "ab"] == [9 + 2, 5 + 4]
    mgr.check_integrity()


@pytest.mark.parametrize("counts", [[0, 4], [4, 0], 0], ids=["first-row", "second-row", "all"])
def test_prepare_step_refuses_zero_new_tokens_and_changes_nothing(counts):
    mgr = two_generating()
    mgr.add_request("w")  # waiting: a refused step must not give it a slot
    rows = ["a", "b", "w"]
    counts = counts if isinstance(counts, int) else counts + [3]
    before = {r: (mgr.entry(r).num_tokens, list(mgr.entry(r).pages), mgr.entry(r).slot) for r in rows}
    free = (mgr.num_free_slots, mgr.num_free_pages)
    with pytest.raises(InvalidCountError):
        mgr.prepare_step(rows, counts)
    assert {r: (mgr.entry(r).num_tokens, list(mgr.entry(r).pages), mgr.entry(r).slot) for r in rows} == before
    assert (mgr.num_free_slots, mgr.num_free_pages) == free and mgr.status("w") == Status.WAITING
    mgr.prepare_step(rows, [1, 4, 3])  # nothing is pending: the next step runs
    mgr.accept([1, 3, 3])
    assert [mgr.entry(r).num_tokens for r in rows] == [10, 8, 3]
    mgr.check_integrity()


def test_a_sampler_fault_after_the_forward_leaves_the_llm_usable(checkpoint, monkeypatch):
    path = checkpoint("nemotron_h")
    expected = tokens(LLM(path, page_size=4).generate(PROMPTS[:3], GREEDY))
    llm = LLM(path, page_size=4)
    rids = [llm.add_request(p, GREEDY) for p in PROMPTS[:3]]
    # greedy generation steps sample through `sample_greedy`: its 5th call fails after the forward ran
    monkeypatch.setattr(step_tokens, "sample_greedy", FailOnCall(step_tokens.sample_greedy, 5))
    outputs: dict[int, list[int]] = {}
    step_until_raises(llm, outputs)
    llm.manager.check_integrity()
    step_to_end(llm, outputs)
    assert [outputs[r] for r in rids] == expected


def test_a_rebalance_that_would_strand_a_request_is_refused(checkpoint):
    path = checkpoint("nemotron_h")
    prompt, params = list(range(3, 23)), SamplingParams(max_tokens=32, ignore_eos=True)
    probe = LLM(path, max_num_seqs=1, device_cache_bytes=1 << 20, page_size=4)
    sizing, whole_pages = probe.sizing, -(-(len(prompt) + 32 + 1) // 4)
    budget = 2 * sizing.request_bytes(len(prompt) + 32 + 1, 4)

    def make() -> LLM:
        return LLM(path, max_num_seqs=8, page_size=4, device_cache_bytes=budget, num_slots=1, max_model_len=64)

    expected = tokens(make().generate([prompt], params))
    llm = make()
    rid = llm.add_request(prompt, params)
    for _ in range(3):
        llm.step()
    # the live request fits the new split now (the manager alone would re-carve it); its whole length does not
    n = next(n for n in range(1, 64) if sizing.split(budget, n) < whole_pages)
    mgr = llm.manager
    assert mgr.can_rebalance(n) and mgr.status(rid) == Status.GENERATION
    e = mgr.entry(rid)
    held, state, split = (e.slot, list(e.pages), e.num_tokens), mgr.live_state(rid), (mgr.num_slots, mgr.num_pages)
    with pytest.raises(BudgetTooSmallError):
        llm.rebalance(n)
    mgr.check_integrity()
    assert (mgr.num_slots, mgr.num_pages) == split
    e = mgr.entry(rid)
    assert (e.slot, list(e.pages), e.num_tokens) == held and mgr.status(rid) == Status.GENERATION
    assert_same_state(state, mgr.live_state(rid))
    outputs: dict[int, list[int]] = {}
    step_to_end(llm, outputs, max_steps=100)
    assert outputs[rid] == expected[0]
