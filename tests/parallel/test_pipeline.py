"""`LLM(pipeline_parallel_size=2)` (stage 0 here, stage 1 spawned, gloo) gives the greedy tokens of one rank for
every family, with a second stage that holds attention and MLP layers only (no slots, no slot roles): plain
decoding, and n-gram speculation under memory pressure with suspensions and live rebalances."""
from __future__ import annotations

import pytest

from hybridcache import LLM
from hybridcache.models.loader import model_on_meta
from hybridcache.parallel import ShardingError
from hybridcache.parallel.pipeline import split_layers
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen
from tests.models.test_qwen3_next import ATTN, GDN
from tests.parallel.pressure import GREEDY, check_pressured_run, pressured_llm, reference

KIMI = {"kda_layers": [1, 2], "full_attn_layers": [3, 4], "head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4}
# recurrent layers in the first half only: stage 1 is attention-only
SAVERS = {
    "nemotron_h": lambda p: nemotron.save_tiny(p, hybrid_override_pattern="M-M-**E"),  # stage 1: "-**E"
    "qwen3_next": lambda p: qwen.save_tiny(p, layer_types=[GDN, GDN, ATTN, ATTN]),
    "kimi_linear": lambda p: kimi.save_tiny(p, linear_attn_config=KIMI),
}


FAMILIES = sorted(SAVERS)
# each spawned LLM costs a few seconds of process start: plain decoding of the other families runs with --runslow
PLAIN = ["nemotron_h", *(pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES if f != "nemotron_h")]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """family -> (checkpoint, prompts, one rank's greedy tokens), made on first use."""
    made = {}

    def get(name: str):
        if name not in made:
            path, _ = SAVERS[name](tmp_path_factory.mktemp(name))
            made[name] = path, *reference(path)
        return made[name]

    return get


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, references):
    return references(request.param)


def test_split_rule():
    assert [(s.first, s.end) for s in split_layers(7, 2)] == [(0, 3), (3, 7)]
    assert [(s.first, s.end) for s in split_layers(4, 3)] == [(0, 1), (1, 2), (2, 4)]
    with pytest.raises(ShardingError, match="pipeline_parallel_size 5 exceeds the model's 4 decoder layers"):
        split_layers(4, 5)


def test_stages_hold_every_checkpoint_tensor_once(family):
    path = family[0]
    whole = set(model_on_meta(path).tensor_targets())
    parts = [set(model_on_meta(path, stage=s).tensor_targets()) for s in split_layers(len(model_on_meta(path).layer_kinds()), 2)]
    assert parts[0] | parts[1] == whole and not parts[0] & parts[1]
    assert not model_on_meta(path, stage=split_layers(len(model_on_meta(path).layer_kinds()), 2)[1]).state_modules(2)


def test_refused_splits_start_nothing(family):
    with pytest.raises(ShardingError, match="tensor_parallel_size 3 does not divide"):
        LLM(family[0], pipeline_parallel_size=2, tensor_parallel_size=3)
    with pytest.raises(ShardingError, match="exceeds the model's"):
        LLM(family[0], pipeline_parallel_size=9)


@pytest.mark.parametrize("name", PLAIN)
def test_pipeline_parallel_2_plain_equals_1(references, name):
    path, prompts, want = references(name)
    llm = LLM(path, max_model_len=64, page_size=4, pipeline_parallel_size=2, parallel_timeout_s=60)
    try:
        first, second = llm.stages
        assert first.slot_roles and first.slot_bytes > 0 and not first.page_roles  # recurrent layers only
        assert second.slot_roles == () and second.slot_bytes == 0 and second.page_bytes > 0  # attention-only
        assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == want
        llm.manager.check_integrity()
    finally:
        llm.close()


def test_pipeline_parallel_2_speculative_under_pressure_equals_1(family):
    path, prompts, want = family
    whole = model_on_meta(path)  # the budget covers the whole model, every stage carving its part
    llm = pressured_llm(path, whole, prompts, pipeline_parallel_size=2)
    try:
        assert llm.stages[1].slot_bytes == 0
        check_pressured_run(llm, prompts, want)
    finally:
        llm.close()
