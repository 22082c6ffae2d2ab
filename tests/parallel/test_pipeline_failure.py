"""A pipeline stage that dies or hangs reaches the caller as TensorParallelError (the error tensor parallelism
raises) within the group timeout; the LLM then refuses every step at once, and close() returns."""
from __future__ import annotations

import pytest

from hybridcache import LLM
from tests.parallel.failure import TIMEOUT_S, check_a_failed_peer_is_reported, checkpoint  # noqa: F401 (a fixture)


@pytest.mark.parametrize("how", ["killed", pytest.param("hung", marks=pytest.mark.slow)])  # hung: > the timeout
def test_a_failed_stage_raises_within_the_timeout(checkpoint, how):
    llm = LLM(checkpoint, max_model_len=32, page_size=4, pipeline_parallel_size=2, parallel_timeout_s=TIMEOUT_S)
    check_a_failed_peer_is_reported(llm, how, match="worker failure")
