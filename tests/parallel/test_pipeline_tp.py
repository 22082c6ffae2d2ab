"""`LLM(pipeline_parallel_size=2, tensor_parallel_size=2)`: four ranks (rank 0 here, three spawned, gloo), each
stage's two ranks holding their shards of its layers and all-reducing in their own group. It gives one process's
greedy tokens under n-gram speculation with memory pressure (suspensions, live rebalances), and
prefix caching's tokens, logprobs and hit counts."""
from __future__ import annotations

import pytest

from hybridcache.models.loader import model_on_meta
from hybridcache.parallel import TPGroup
from tests.models import helpers as nemotron
from tests.parallel.prefix import check_parallel_prefix_caching
from tests.parallel.pressure import check_pressured_run, pressured_llm, reference

SIZES = dict(pipeline_parallel_size=2, tensor_parallel_size=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Mamba2, attention and MLP or MoE layers on both stages: M*- | EM*."""
    return nemotron.save_tiny(tmp_path_factory.mktemp("nemotron"), hybrid_override_pattern="M*-EM*")[0]


def test_pipeline_2_x_tensor_parallel_2_speculative_under_pressure_equals_1(checkpoint):
    prompts, want = reference(checkpoint)
    shard = model_on_meta(checkpoint, tp=TPGroup(0, 2))  # the budget: rank 0's shard of the whole model
    llm = pressured_llm(checkpoint, shard, prompts, **SIZES)
    try:
        assert [(c.stage.index, c.tp_rank) for c in llm.stages] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        by_rank = [(c.slot_bytes, c.page_bytes, c.arena_bytes) for c in llm.stages]
        assert by_rank[0] == by_rank[1] and by_rank[2] == by_rank[3] and all(min(b) > 0 for b in by_rank)
        check_pressured_run(llm, prompts, want)
    finally:
        llm.close()


@pytest.mark.slow
def test_pipeline_2_x_tensor_parallel_2_prefix_caching_equals_1(checkpoint):
    check_parallel_prefix_caching(checkpoint, **SIZES)
