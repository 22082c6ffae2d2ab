"""A pipeline stage that dies or hangs reaches the caller as TensorParallelError (the error tensor parallelism
raises) within the group timeout; the LLM then refuses every step at once, and close() returns."""
from __future__ import annotations

import os
import signal
import time

import pytest

from hybridcache import LLM, SamplingParams
from hybridcache.parallel import TensorParallelError
from tests.models import helpers as nemotron

TIMEOUT_S = 5.0
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return nemotron.save_tiny(tmp_path_factory.mktemp("nemotron"))[0]


@pytest.mark.parametrize("how", ["killed", pytest.param("hung", marks=pytest.mark.slow)])  # hung: > the timeout
def test_a_failed_stage_raises_within_the_timeout(checkpoint, how):
    llm = LLM(checkpoint, max_model_len=32, page_size=4, pipeline_parallel_size=2, parallel_timeout_s=TIMEOUT_S)
    (stage,) = llm.workers.processes
    try:
        assert len(llm.generate(PROMPTS, PARAMS)) == 2
        os.kill(stage.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(TensorParallelError, match="worker failure"):
            llm.generate(PROMPTS, PARAMS)
        assert time.monotonic() - start < TIMEOUT_S + 5
        start = time.monotonic()
        with pytest.raises(TensorParallelError):  # at once, without touching the group again
            llm.generate(PROMPTS, PARAMS)
        assert time.monotonic() - start < 1
        assert llm.manager.requests() == []  # the failed requests were aborted
    finally:
        if how == "hung":
            os.kill(stage.pid, signal.SIGKILL)
        llm.close()
    assert stage.exitcode is not None
