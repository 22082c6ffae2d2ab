"""Prefix caching under `tensor_parallel_size=2` (rank 0 here, one spawned worker, gloo): every rank carves
the snapshot rows and restores and saves the same snapshots, so the greedy tokens equal caching off at
TP 1, and the hit counts equal caching on at TP 1 (rank 0's planner decides for every rank)."""
from __future__ import annotations

import pytest

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from tests.engine.test_prefix_caching import grouped
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny}
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


def two_turns(llm: LLM, prompts: list[list[int]], rebalance: bool = False) -> tuple[list[list[int]], tuple]:
    """A first turn of grouped prompts, a rebalance (the snapshot rows keep their ids), then each conversation's
    second turn; the tokens of both turns and (queries, hits, snapshots saved)."""
    first = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    if rebalance:
        llm.rebalance(llm.manager.num_slots - 1)
    second = [o.token_ids for o in llm.generate([p + w + [7, 8] for p, w in zip(prompts, first)], GREEDY)]
    s = llm.stats
    return first + second, (s.prefix_cache_queries, s.prefix_cache_hits, s.num_snapshots_saved)


@pytest.mark.parametrize("name", sorted(SAVERS))
def test_tensor_parallel_2_prefix_caching_equals_1(name, tmp_path):
    path, _ = SAVERS[name](tmp_path)
    prompts = grouped(4, groups=2, per=3, shared=20)
    kw = dict(page_size=4, max_model_len=128, max_num_seqs=4, speculative=SpeculativeConfig(num_draft_tokens=2))
    cached = dict(enable_prefix_caching=True, prefix_snapshot_interval=8, device_cache_bytes=1 << 22)
    want, _ = two_turns(LLM(path, **kw), prompts)
    one_tokens, one_counts = two_turns(LLM(path, **kw, **cached), prompts)
    llm = LLM(path, **kw, **cached, tensor_parallel_size=2, parallel_timeout_s=60)
    try:
        llm.step_hook = llm.manager.check_integrity
        tokens, counts = two_turns(llm, prompts, rebalance=True)
    finally:
        llm.close()
    assert one_tokens == want and tokens == want
    assert counts == one_counts and counts[1] >= 16 * 4 + 8 * len(prompts), counts  # later group members, second turns
