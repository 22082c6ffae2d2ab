"""`LLM(tensor_parallel_size=2)` (rank 0 here, one spawned worker, gloo) gives the greedy tokens of
`tensor_parallel_size=1` for every family: plain decoding, and n-gram speculation under memory pressure
with suspensions, re-prefills and live rebalances (every rank executing rank 0's plans)."""
from __future__ import annotations

import pytest

from hybridcache import LLM
from hybridcache.models.loader import model_on_meta
from hybridcache.parallel import TPGroup
from tests.engine.families import SAVERS
from tests.parallel.pressure import GREEDY, check_pressured_run, pressured_llm, reference


@pytest.fixture(scope="module", params=sorted(SAVERS))
def family(request, tmp_path_factory):
    """(checkpoint, prompts, TP 1's greedy tokens)."""
    path, _ = SAVERS[request.param](tmp_path_factory.mktemp(request.param))
    return path, *reference(path)


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
    llm = pressured_llm(path, shard, prompts, tensor_parallel_size=2)
    try:
        check_pressured_run(llm, prompts, want)
    finally:
        llm.close()
