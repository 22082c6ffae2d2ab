"""A tensor-parallel worker that dies or hangs reaches the caller as TensorParallelError within the group
timeout, never as a silent hang; the LLM then refuses every step at once, and close() returns."""
from __future__ import annotations

import pytest

from hybridcache import LLM
from hybridcache.parallel import ShardingError
from tests.models import test_qwen3_next as qwen
from tests.parallel.failure import TIMEOUT_S, check_a_failed_peer_is_reported, checkpoint  # noqa: F401 (a fixture)


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_failed_worker_raises_within_the_timeout(checkpoint, how):
    llm = LLM(checkpoint, max_model_len=32, page_size=4, tensor_parallel_size=2, parallel_timeout_s=TIMEOUT_S)
    check_a_failed_peer_is_reported(llm, how, match="tensor-parallel worker failure")


def test_a_size_that_does_not_split_the_model_is_refused_before_any_process_starts(tmp_path):
    path, _ = qwen.save_tiny(tmp_path, "B")  # 1 key head
    with pytest.raises(ShardingError, match="tensor_parallel_size 2 does not divide linear_num_key_heads = 1"):
        LLM(path, tensor_parallel_size=2)
