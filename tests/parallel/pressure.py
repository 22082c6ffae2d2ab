"""What the TP and PP equivalence tests share: the workload (prompts of repeated motifs, so that n-gram
drafts get accepted; one process's greedy tokens as the reference) and the speculative run under memory
pressure with arrivals, suspensions and rebalances."""
from __future__ import annotations

import random
from pathlib import Path

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.cache import sizing_of
from tests.engine.arrivals import run_with_arrivals

SPEC = SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=2)
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def reference(path: Path) -> tuple[list[list[int]], list[list[int]]]:
    """(8 prompts of repeated motifs, their greedy tokens from one process without parallelism)."""
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 96) for _ in range(rng.randint(3, 8))] * rng.randint(1, 3) for _ in range(8)]
    return prompts, [o.token_ids for o in LLM(path, max_model_len=64, page_size=4).generate(prompts, GREEDY)]


def pressured_llm(path: Path, model, prompts: list[list[int]], **parallel) -> LLM:
    """Four slots of speculative decoding under a device budget that forces suspensions; `model` (on the
    meta device: the whole model for PP, rank 0's shard for TP, as the budget is counted) sizes it."""
    sizing = sizing_of(model.state_modules(SPEC.num_draft_tokens), model.page_roles(4))
    per = sizing.request_bytes(max(map(len, prompts)) + GREEDY.max_tokens + 3, 4)
    budget = 4 * sizing.bytes_per_slot + int((per - sizing.bytes_per_slot) * 1.6)
    return LLM(path, max_model_len=64, page_size=4, speculative=SPEC, max_num_seqs=4, num_slots=4,
               device_cache_bytes=budget, host_cache_bytes=int(per * 1.5), max_num_batched_tokens=16,
               parallel_timeout_s=60, **parallel)


def check_pressured_run(llm: LLM, prompts: list[list[int]], want: list[list[int]]) -> None:
    """Arrivals and rebalances (`run_with_arrivals`, seed 2, greedy) give `want`, with suspensions, accepted
    drafts and rebalances along the way; no slot or page stays owned."""
    got, _ = run_with_arrivals(llm, prompts, [GREEDY] * len(prompts), seed=2)
    assert got == want
    s = llm.stats
    assert s.num_suspensions > 0 and s.num_accepted_tokens > 0 and s.num_rebalances > 0, s
    assert llm.manager.slot_pool.num_owned == 0 and llm.manager.page_pool.num_owned == 0
