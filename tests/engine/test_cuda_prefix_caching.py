"""Prefix caching on the GPU (fp32, CUDA graphs, Triton kernels): the tokens equal caching off for the three
families, greedy and seeded sampling, plain and with n-gram speculation, through shared prefixes and a
second turn that starts where the first ended. GPU only."""
from __future__ import annotations

import pytest
import torch

from hybridcache import LLM
from tests.engine.test_cuda_graphs import SPECULATIVE, checkpoint  # noqa: F401 (checkpoint is a fixture)
from tests.engine.test_prefix_caching import grouped, mixed_params

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                                reason="needs a CUDA device of compute capability 9.0 (bf16 grouped GEMM for MoE)")


@pytest.mark.parametrize("spec", SPECULATIVE)
def test_on_equals_off_on_cuda(checkpoint, spec):
    _, path = checkpoint
    kw = dict(device="cuda", dtype="float32", max_num_seqs=4, speculative=SPECULATIVE[spec], page_size=4,
              max_model_len=128)
    off = LLM(path, **kw)
    on = LLM(path, enable_prefix_caching=True, prefix_snapshot_interval=8, **kw)
    on.step_hook = on.manager.check_integrity
    prompts = grouped(0)
    params = mixed_params(len(prompts))
    want = [o.token_ids for o in off.generate(prompts, params)]
    assert [o.token_ids for o in on.generate(prompts, params)] == want
    turn2 = [p + w + [7, 8, 9] for p, w in zip(prompts, want)]
    hits = on.stats.prefix_cache_hits
    assert [o.token_ids for o in on.generate(turn2, params)] == [o.token_ids for o in off.generate(turn2, params)]
    assert hits >= 16 * 2 and on.stats.prefix_cache_hits - hits >= 8 * len(turn2)
    assert on.runner.graphs.num_replays > 0
