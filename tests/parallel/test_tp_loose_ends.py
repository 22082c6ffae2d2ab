"""Tensor-parallel loose ends: a store operation that fails on rank 0 alone is never sent to the workers, so
the ranks stay alike and the LLM goes on giving TP 1's tokens; the worker start-up wait is an option
(`parallel_startup_timeout_s`); `hybridcache generate --tensor-parallel-size 2` prints size 1's output."""
from __future__ import annotations

import time

import pytest

from hybridcache import LLM, SamplingParams
from hybridcache.cli import main
from hybridcache.engine.errors import InvalidParamsError
from hybridcache.parallel import TensorParallelError
from tests.models import helpers as nemotron

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], [9, 10, 11], [12, 13, 14, 15, 16, 17, 18]]
KW = {"max_model_len": 64, "page_size": 4, "num_slots": 4}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return nemotron.save_tiny(tmp_path_factory.mktemp("nemotron"))[0]


def test_a_rebalance_that_fails_on_rank_0_alone_leaves_the_ranks_alike(checkpoint):
    want = [o.token_ids for o in LLM(checkpoint, **KW).generate(PROMPTS, GREEDY)]
    llm = LLM(checkpoint, tensor_parallel_size=2, parallel_timeout_s=30, **KW)
    try:
        ids = [llm.add_request(p, GREEDY) for p in PROMPTS]
        for _ in range(3):
            llm.step()
        local = llm.manager.store.local

        def fail_here(*args):  # rank 0's store only: the workers would carve 3 slots, rank 0 keep 4
            raise RuntimeError("injected rank-0 failure")

        local.recarve = fail_here
        with pytest.raises(RuntimeError, match="injected"):
            llm.rebalance(3)
        del local.recarve
        assert llm.manager.num_slots == 4
        llm.manager.check_integrity()
        got = {}
        while llm.has_unfinished():
            for out in llm.step():
                got[out.request_id] = out.token_ids
            llm.manager.check_integrity()
        assert [got[i] for i in ids] == want
        assert llm.rebalance(3) >= 0 and llm.generate(PROMPTS[:1], GREEDY)[0].token_ids == want[0]  # still whole
    finally:
        llm.close()


def test_the_worker_start_up_wait_is_an_option(checkpoint):
    with pytest.raises(InvalidParamsError, match="parallel_startup_timeout_s"):
        LLM(checkpoint, tensor_parallel_size=2, parallel_startup_timeout_s=0)
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"did not load their shards within 0.2 s"):
        LLM(checkpoint, tensor_parallel_size=2, parallel_startup_timeout_s=0.2)  # a spawn alone takes longer
    assert time.monotonic() - start < 10


def test_cli_generate_tensor_parallel_2_prints_size_1s_tokens(capsys):
    argv = ["generate", "--token-ids", "5,6,7,5,6", "--token-ids", "9,8,7", "--max-tokens", "8", "--ignore-eos"]
    assert main(argv) == 0
    one = capsys.readouterr().out
    assert main(argv + ["--tensor-parallel-size", "2"]) == 0
    two = capsys.readouterr().out
    assert len(one.splitlines()) == 2 and one.strip() and two == one
