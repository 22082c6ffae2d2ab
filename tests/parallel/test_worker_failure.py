"""A tensor-parallel worker that dies or hangs reaches the caller as TensorParallelError within the group
timeout, never as a silent hang; the LLM then refuses every step at once, and close() returns."""
from __future__ import annotations

import os
import signal
import time

import pytest

from hybridcache import LLM, SamplingParams
from hybridcache.parallel import ShardingError, TensorParallelError
from tests.models import helpers as nemotron
from tests.models import test_qwen3_next as qwen

TIMEOUT_S = 5.0
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return nemotron.save_tiny(tmp_path_factory.mktemp("nemotron"))[0]


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_failed_worker_raises_within_the_timeout(checkpoint, how):
    llm = LLM(checkpoint, max_model_len=32, page_size=4, tensor_parallel_size=2, parallel_timeout_s=TIMEOUT_S)
    (worker,) = llm.workers.processes
    try:
        assert len(llm.generate(PROMPTS, PARAMS)) == 2
        os.kill(worker.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(TensorParallelError, match="tensor-parallel worker failure"):
            llm.generate(PROMPTS, PARAMS)
        assert time.monotonic() - start < TIMEOUT_S + 5
        start = time.monotonic()
        with pytest.raises(TensorParallelError):  # at once, without touching the group again
            llm.generate(PROMPTS, PARAMS)
        assert time.monotonic() - start < 1
        assert llm.manager.requests() == []  # the failed requests were aborted
    finally:
        if how == "hung":
            os.kill(worker.pid, signal.SIGKILL)
        llm.close()
    assert worker.exitcode is not None


def test_a_size_that_does_not_split_the_model_is_refused_before_any_process_starts(tmp_path):
    path, _ = qwen.save_tiny(tmp_path, "B")  # 1 key head
    with pytest.raises(ShardingError, match="tensor_parallel_size 2 does not divide linear_num_key_heads = 1"):
        LLM(path, tensor_parallel_size=2)
