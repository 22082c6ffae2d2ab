"""The device split between recurrent slots and attention pages follows demand (issue 8).

A budget of `device_bytes_needed(L + lookahead)` (lookahead: the drafts + 1) serves any one request of total
length L; N times that runs N such requests at once. Under tighter and looser budgets the outputs equal the
unconstrained run, with few policy rebalances. The old fixed half split refused or under-served these
budgets. `check_integrity()` runs after every step.
"""
from __future__ import annotations

import random

import pytest

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.cache.entries import pages_for
from hybridcache.engine.errors import RequestTooLargeError
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny}
SPECS = {"plain": None, "ngram": SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=2)}
L = 32  # prompt + max_tokens of every request here
PAGE = 4


@pytest.fixture(scope="module", params=sorted(SAVERS))
def checkpoint(request, tmp_path_factory):
    path, _ = SAVERS[request.param](tmp_path_factory.mktemp(request.param))
    return path


@pytest.fixture(params=sorted(SPECS))
def spec(request) -> SpeculativeConfig | None:
    return SPECS[request.param]


def lookahead(spec: SpeculativeConfig | None) -> int:
    return (spec.num_draft_tokens if spec else 0) + 1


def engine(path, spec: SpeculativeConfig | None, **kw) -> LLM:
    return LLM(path, speculative=spec, max_model_len=64, page_size=PAGE, **kw)


def run(llm: LLM, prompts: list[list[int]], params) -> tuple[list[list[int]], int]:
    """The outputs, and the most requests running at once; the cache's integrity is checked after every step."""
    peak = 0

    def hook() -> None:
        nonlocal peak
        llm.manager.check_integrity()
        peak = max(peak, len(llm.scheduler.running))

    llm.step_hook = hook
    outs = [o.token_ids for o in llm.generate(prompts, params)]
    mgr = llm.manager
    assert mgr.requests() == [] and mgr.slot_pool.num_owned == 0 and mgr.page_pool.num_owned == 0
    return outs, peak


def prompts_of(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 90) for _ in range(n)] for n in lengths]


def test_one_budget_serves_one_request_and_n_budgets_run_n_at_once(checkpoint, spec):
    """The contract, exactly: `device_bytes_needed(L + lookahead)` runs one request of length L without a
    suspension, three times that runs three at once, one byte less refuses the request up front."""
    prompts = prompts_of([12, 12, 12], seed=0)
    params = SamplingParams(max_tokens=L - 12, ignore_eos=True)
    free = engine(checkpoint, spec, max_num_seqs=8)
    expected = [o.token_ids for o in free.generate(prompts, params)]
    need = free.device_bytes_needed(L + lookahead(spec))

    one = engine(checkpoint, spec, max_num_seqs=8, device_cache_bytes=need)
    assert run(one, prompts[:1], params) == (expected[:1], 1)
    assert one.stats.num_suspensions == one.stats.num_reprefills == 0

    three = engine(checkpoint, spec, max_num_seqs=8, device_cache_bytes=3 * need)
    assert run(three, prompts, params) == (expected, 3)
    s = three.stats
    assert s.num_suspensions == s.num_reprefills == 0 and s.num_rebalances <= len(prompts), s

    with pytest.raises(RequestTooLargeError):
        engine(checkpoint, spec, device_cache_bytes=need - 1).generate(prompts[:1], params)


def test_budget_sweep_equals_the_unconstrained_run_with_few_rebalances(checkpoint, spec):
    """8 short prompts growing to L under 1.3x, 2.2x and 3.1x one request's bytes, greedy and seeded
    sampling mixed: the budgets force suspensions and re-splits, never other tokens."""
    prompts = prompts_of([3, 8, 5, 4, 7, 6, 3, 8], seed=1)
    params = [SamplingParams(max_tokens=L - len(p), ignore_eos=True, temperature=0.9 if i % 2 else 0.0,
                             top_p=0.9, seed=i) for i, p in enumerate(prompts)]
    free = engine(checkpoint, spec, max_num_seqs=8)
    expected = [o.token_ids for o in free.generate(prompts, params)]
    need = free.device_bytes_needed(L + lookahead(spec))
    suspensions = rebalances = 0
    for factor in (1.3, 2.2, 3.1):
        llm = engine(checkpoint, spec, max_num_seqs=8, device_cache_bytes=int(factor * need))
        outs, peak = run(llm, prompts, params)
        assert outs == expected, factor
        s = llm.stats
        assert peak >= int(factor), (factor, peak)
        assert s.num_rebalances <= len(prompts), (factor, s)  # a thrashing policy re-splits every few steps
        suspensions += s.num_suspensions
        rebalances += s.num_rebalances
    assert suspensions > 0 and rebalances > 0, (suspensions, rebalances)


def old_fixed_slots(llm: LLM, budget: int, max_num_seqs: int) -> int:
    """The slots the old default gave: half the budget, in slots."""
    return min(max_num_seqs, budget // 2 // llm.sizing.bytes_per_slot)


def test_a_request_the_old_half_split_could_not_hold_runs(checkpoint):
    """1.3x one request's bytes: half of it for slots left too few pages for the request (the old split
    refused it with RequestTooLargeError); the demand split serves it."""
    prompt = prompts_of([8], seed=2)
    params = SamplingParams(max_tokens=L - 8, ignore_eos=True)
    free = engine(checkpoint, None, max_num_seqs=8)
    expected = [o.token_ids for o in free.generate(prompt, params)]
    budget = int(1.3 * free.device_bytes_needed(L))
    fixed = engine(checkpoint, None, max_num_seqs=8, device_cache_bytes=budget,
                   num_slots=old_fixed_slots(free, budget, 8))
    assert fixed.manager.num_pages < pages_for(L, PAGE)
    demand = engine(checkpoint, None, max_num_seqs=8, device_cache_bytes=budget)
    assert run(demand, prompt, params) == (expected, 1)


def test_five_requests_budget_runs_five_at_once_where_the_old_half_split_ran_fewer(checkpoint, spec):
    """5x one request's bytes, 8 equal requests, a large max_num_seqs: the old half split carved too many
    slots (pages ran out at 4 requests) or, with speculation's large slots, too few (3 on nemotron_h); the
    demand split runs 5 at once, never fewer than the fixed split, with the same tokens."""
    prompts = prompts_of([L - 4] * 8, seed=3)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    free = engine(checkpoint, spec, max_num_seqs=16)
    expected = [o.token_ids for o in free.generate(prompts, params)]
    budget = 5 * free.device_bytes_needed(L + lookahead(spec))
    fixed = engine(checkpoint, spec, max_num_seqs=16, device_cache_bytes=budget,
                   num_slots=old_fixed_slots(free, budget, 16))
    demand = engine(checkpoint, spec, max_num_seqs=16, device_cache_bytes=budget)
    fixed_outs, fixed_peak = run(fixed, prompts, params)
    demand_outs, demand_peak = run(demand, prompts, params)
    assert fixed_outs == demand_outs == expected
    assert demand_peak >= max(5, fixed_peak), (demand_peak, fixed_peak)
    assert demand.stats.num_rebalances <= len(prompts), demand.stats


def test_a_fixed_split_refuses_up_front_a_request_its_pages_cannot_hold(tmp_path):
    """With `num_slots` fixed, the pages beside the slots bound a request: refused at once, not stuck."""
    path, _ = nemotron.save_tiny(tmp_path)
    probe = LLM(path, page_size=4, max_model_len=64)
    budget = 3 * probe.device_bytes_needed(20)  # 3 slots and 15 pages; the request needs 16 pages
    prompt, params = [t % 90 + 1 for t in range(55)], SamplingParams(max_tokens=8, ignore_eos=True)
    llm = LLM(path, page_size=4, max_model_len=64, num_slots=3, device_cache_bytes=budget)
    with pytest.raises(RequestTooLargeError, match="fixed split"):
        llm.add_request(prompt, params)
    demand = LLM(path, page_size=4, max_model_len=64, device_cache_bytes=budget)
    out = demand.generate([prompt], params)
    assert len(out[0].token_ids) == 8
