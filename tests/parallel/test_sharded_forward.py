"""Each family's sharded forward (2 ranks, fp32) against the unsharded one: prefill, plain decode and
speculative verify logits within fp32 tolerance, every rank's logits alike; sharded sizing; refusals."""
from __future__ import annotations

import pytest
import torch

from hybridcache.cache import sizing_of
from hybridcache.models import load_model
from hybridcache.models.loader import model_on_meta
from hybridcache.parallel import ShardingError, TPGroup
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen
from tests.models.helpers import Driver

from .helpers import on_thread_ranks

SAVERS = {
    "nemotron_h": nemotron.save_tiny,
    "nemotron_h, 1 group (norm across ranks), 1 kv head (replicated)": lambda p: nemotron.save_tiny(
        p, n_groups=1, num_key_value_heads=1),
    "qwen3_next": qwen.save_tiny,
    "kimi_linear": kimi.save_tiny,
    "kimi_linear, q lora, biases, 2 shared": lambda p: kimi.save_tiny(p, **list(kimi.CONFIGS.values())[1]),
}


def script(model, k: int) -> list[torch.Tensor]:
    """Prefill two requests, one plain or verify step, a mixed step; every row's logits, flattened."""
    drv = Driver(model, num_draft_tokens=k)
    out = drv.prefill({"a": list(range(3, 14)), "b": [5, 9, 11, 4, 7]})
    gen = [("a", [20, 21, 22][: k + 1]), ("b", [30, 31, 32][: k + 1])]
    out += drv.step([], gen)
    drv.accept([1, k + 1] if k else None)
    drv.mgr.add_request("c")
    out += drv.step([("c", [8, 9, 10, 11])], [("a", [40, 41, 42][: k + 1])] if k else [("a", [40])])
    drv.accept()
    return out


@pytest.mark.parametrize("k", [0, 2], ids=["decode", "verify"])
@pytest.mark.parametrize("family", sorted(SAVERS))
def test_sharded_logits_equal_the_unsharded_forward(tmp_path, family, k):
    path, _ = SAVERS[family](tmp_path)
    want = script(load_model(path), k)
    got = on_thread_ranks(2, lambda tp: script(load_model(path, tp=tp), k))
    for rank, logits in enumerate(got):
        for i, (g, w) in enumerate(zip(logits, want)):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=0, msg=lambda m: f"rank {rank}, row {i}: {m}")


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_next", "kimi_linear"])
def test_each_rank_holds_its_shard_of_every_role(tmp_path, family):
    path, _ = SAVERS[family](tmp_path)
    whole = load_model(path)
    half = model_on_meta(path, tp=TPGroup(1, 2))
    (s1,), (s2,) = whole.state_modules(2), half.state_modules(2)
    for r1, r2 in zip(s1.roles(), s2.roles()):
        if r1.name not in ("pnat", "buf_idx", "pend_n"):
            assert r2.row_bytes * 2 == r1.row_bytes, r1.name
    p1, p2 = whole.page_roles(4), half.page_roles(4)
    shrink = 1 if family == "kimi_linear" else 2  # MLA's latent is replicated: every head reads all of it
    assert sizing_of([], p1).bytes_per_page == shrink * sizing_of([], p2).bytes_per_page


def test_a_size_that_does_not_divide_the_heads_is_refused(tmp_path):
    path, _ = qwen.save_tiny(tmp_path, "B")  # 1 key head
    with pytest.raises(ShardingError, match="linear_num_key_heads = 1"):
        model_on_meta(path, tp=TPGroup(0, 2))
