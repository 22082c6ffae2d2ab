"""`LLM(tensor_parallel_size=2)` (rank 0 here, one spawned worker, gloo) gives the greedy tokens of
`tensor_parallel_size=1` for every family: plain decoding, and n-gram speculation under memory pressure
with suspensions, re-prefills and live rebalances (every rank executing rank 0's plans)."""
from __future__ import annotations

import random

import pytest

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.cache import sizing_of
from hybridcache.models.loader import model_on_meta
from hybridcache.parallel import TPGroup
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny}
SPEC = SpeculativeConfig(num_draft_tokens=2)
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(SAVERS))
def family(request, tmp_path_factory):
    """(checkpoint, prompts, TP 1's greedy tokens)."""
    path, _ = SAVERS[request.param](tmp_path_factory.mktemp(request.param))
    rng = random.Random(1)
    # repeated motifs so that n-gram drafts get accepted
    prompts = [[rng.randrange(3, 96) for _ in range(rng.randint(3, 8))] * rng.randint(1, 3) for _ in range(8)]
    want = [o.token_ids for o in LLM(path, max_model_len=64, page_size=4).generate(prompts, GREEDY)]
    return path, prompts, want


def test_tensor_parallel_2_plain_equals_1(family):
    path, prompts, want = family
    llm = LLM(path, max_model_len=64, page_size=4, tensor_parallel_size=2, parallel_timeout_s=60)
    try:
        assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == want
        llm.manager.check_integrity()
    finally:
        llm.close()


def test_tensor_parallel_2_speculative_under_pressure_equals_1(family):
    path, prompts, want = family
    shard = model_on_meta(path, tp=TPGroup(0, 2))  # rank 0's shard: the budget is per rank
    sizing = sizing_of(shard.state_modules(SPEC.num_draft_tokens), shard.page_roles(4))
    per = sizing.request_bytes(max(map(len, prompts)) + GREEDY.max_tokens + 3, 4)
    budget = 4 * sizing.bytes_per_slot + int((per - sizing.bytes_per_slot) * 1.6)
    llm = LLM(path, max_model_len=64, page_size=4, speculative=SPEC, max_num_seqs=4, num_slots=4,
              device_cache_bytes=budget, host_cache_bytes=int(per * 1.5), max_num_batched_tokens=16,
              tensor_parallel_size=2, parallel_timeout_s=60)
    try:
        rng, pending, ids, got = random.Random(2), list(range(len(prompts))), {}, {}
        while pending or llm.has_unfinished():
            for _ in range(rng.randint(0, 2)):
                if pending:
                    i = pending.pop(0)
                    ids[llm.add_request(prompts[i], GREEDY)] = i
            if rng.random() < 0.15:
                try:
                    llm.rebalance(rng.choice([2, 3, 4]))
                except ValueError:
                    pass  # that many slots leave no room for one page
            llm.manager.check_integrity()
            for out in llm.step():
                got[ids[out.request_id]] = out.token_ids
        assert [got[i] for i in range(len(prompts))] == want
        s = llm.stats
        assert s.num_suspensions > 0 and s.num_accepted_tokens > 0 and s.num_rebalances > 0, s
        assert llm.manager.slot_pool.num_owned == 0 and llm.manager.page_pool.num_owned == 0
    finally:
        llm.close()
