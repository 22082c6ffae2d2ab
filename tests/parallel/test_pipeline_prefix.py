"""Prefix caching under `pipeline_parallel_size=2` (stage 0 here, stage 1 spawned, gloo): every stage carves rank
0's snapshot rows, and saves and restores the same snapshots over its own layers (a stage without recurrent
layers has no slot roles: nothing to save or restore), so the greedy tokens, logprobs and hit counts equal one
process with prefix caching, across a rebalance between two turns of conversations, and under memory pressure
(suspensions, evictions, spills to the host tier and live rebalances: every stage makes rank 0's copies on its
own store)."""
from __future__ import annotations

import pytest

from hybridcache import LLM
from tests.engine.arrivals import run_with_arrivals
from tests.engine.test_prefix_caching import grouped, mixed_params
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen
from tests.models.test_qwen3_next import ATTN, GDN
from tests.parallel.prefix import check_parallel_prefix_caching, pressured_cached
from tests.parallel.pressure import SPEC

KIMI = {"kda_layers": [1, 3], "full_attn_layers": [2, 4], "head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4}
SAVERS = {  # stage 0's layers | stage 1's
    "nemotron_h": lambda p: nemotron.save_tiny(p, hybrid_override_pattern="M*-EM*"),  # M*- | EM*
    "nemotron_h_attention_only_stage": lambda p: nemotron.save_tiny(p, hybrid_override_pattern="M-M-**E"),  # M-M | -**E
    "qwen3_next": lambda p: qwen.save_tiny(p, layer_types=[GDN, ATTN, GDN, ATTN]),  # GDN ATTN | GDN ATTN
    "kimi_linear": lambda p: kimi.save_tiny(p, linear_attn_config=KIMI),  # KDA MLA | KDA MLA
}
CASES = ["nemotron_h", "nemotron_h_attention_only_stage",
         *(pytest.param(n, marks=pytest.mark.slow) for n in ("qwen3_next", "kimi_linear"))]


@pytest.mark.parametrize("name", CASES)
def test_pipeline_parallel_2_prefix_caching_equals_1(name, tmp_path):
    path, _ = SAVERS[name](tmp_path)
    first, second = check_parallel_prefix_caching(path, pipeline_parallel_size=2).stages
    assert first.slot_roles and (second.slot_roles == ()) == name.endswith("attention_only_stage")


def test_pipeline_parallel_2_prefix_caching_under_pressure_equals_1(tmp_path):
    path, _ = SAVERS["nemotron_h"](tmp_path)
    prompts = grouped(3, groups=3, per=3, shared=16)
    params = mixed_params(len(prompts))
    want = [o.token_ids for o in LLM(path, max_num_seqs=16, speculative=SPEC, max_model_len=64,
                                     page_size=4).generate(prompts, params)]
    one = pressured_cached(path, SPEC, host_requests=6)
    one_tokens, one_rebalances = run_with_arrivals(one, prompts, params, seed=2)
    llm = pressured_cached(path, SPEC, host_requests=6, pipeline_parallel_size=2, parallel_timeout_s=60)
    try:
        tokens, rebalances = run_with_arrivals(llm, prompts, params, seed=2)  # check_integrity() before each step
    finally:
        llm.close()
    assert one_tokens == want and tokens == want and rebalances == one_rebalances > 0
    counts = ("num_suspensions", "num_resumes", "num_reprefills", "num_rebalances", "prefix_cache_hits",
              "prefix_cache_evictions", "prefix_cache_spills", "prefix_cache_host_hits", "num_snapshots_saved")
    got = {c: getattr(llm.stats, c) for c in counts}
    assert got == {c: getattr(one.stats, c) for c in counts}, got
    assert got["num_suspensions"] and got["prefix_cache_hits"], got
