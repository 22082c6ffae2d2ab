"""Prefix caching under `tensor_parallel_size=2` (rank 0 here, one spawned worker, gloo): every rank carves
the snapshot rows and restores and saves the same snapshots, so the greedy tokens (and logprobs) equal caching
off at TP 1, and the hit counts equal caching on at TP 1 (rank 0's planner decides for every rank)."""
from __future__ import annotations

import pytest

from tests.engine.families import SAVERS
from tests.parallel.prefix import check_parallel_prefix_caching


@pytest.mark.parametrize("name", sorted(SAVERS))
def test_tensor_parallel_2_prefix_caching_equals_1(name, tmp_path):
    path, _ = SAVERS[name](tmp_path)
    check_parallel_prefix_caching(path, tensor_parallel_size=2)
