"""Every family under memory pressure with random arrivals, suspensions, re-prefills and rebalances:
outputs equal the unconstrained run, `check_integrity()` holds after every step, nothing leaks."""
from __future__ import annotations

import random

from hybridcache import LLM, SamplingParams
from tests.engine.arrivals import run_with_arrivals
from tests.engine.families import SPEC, checkpoint  # noqa: F401 (checkpoint is a fixture)


def workload(seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 96) for _ in range(rng.randint(3, 20))] for _ in range(10)]
    params = [SamplingParams(max_tokens=rng.randint(8, 14), ignore_eos=True, temperature=rng.choice([0.0, 0.9]),
                             top_p=rng.choice([1.0, 0.9]), seed=i) for i in range(len(prompts))]
    return prompts, params


def test_random_arrivals_rebalances_and_pressure_equal_the_unconstrained_run(checkpoint):
    prompts, params = workload(1)
    free = LLM(checkpoint, max_num_seqs=16, speculative=SPEC, max_model_len=64, page_size=4)
    expected = [o.token_ids for o in free.generate(prompts, params)]

    sizing = free.sizing
    longest = max(map(len, prompts)) + 14 + 3
    per = sizing.request_bytes(longest, 4)
    budget = 4 * sizing.bytes_per_slot + int((per - sizing.bytes_per_slot) * 1.6)
    llm = LLM(checkpoint, max_num_seqs=4, speculative=SPEC, max_model_len=64, page_size=4, num_slots=4,
              device_cache_bytes=budget, host_cache_bytes=int(per * 1.5), max_num_batched_tokens=16)
    llm.step_hook = llm.manager.check_integrity
    got, rebalances = run_with_arrivals(llm, prompts, params, seed=2)
    assert got == expected
    s = llm.stats
    assert rebalances > 0 and s.num_suspensions + s.num_reprefills > 0, s
    assert llm.manager.requests() == []
    mgr = llm.manager
    assert mgr.slot_pool.num_owned == 0 and mgr.page_pool.num_owned == 0
    assert mgr.planner.host_slot_pool.num_owned == 0 and mgr.planner.host_page_pool.num_owned == 0
