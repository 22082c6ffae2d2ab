"""`benchmarks.timing.time_decode_phase`: the engine stepped by hand gives generate's tokens, and the decode
span counts exactly the tokens delivered after the last request's first one (synchronous and asynchronous
plain decode, and speculation, whose steps deliver several tokens a row)."""
from __future__ import annotations

import pytest

from benchmarks.timing import time_decode_phase
from hybridcache import LLM, SamplingParams, SpeculativeConfig
from tests.models import helpers as nemotron

PROMPTS = [[5, 9, 14, 3, 7], [11, 4, 8], [20, 21, 22, 23, 24, 25, 26]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path, _ = nemotron.save_tiny(tmp_path_factory.mktemp("nemotron_h"))
    return path


@pytest.mark.parametrize("engine", ["sync", "async", "speculative"])
def test_decode_phase_counts_the_tokens_after_every_first_one(checkpoint, engine):
    kw = dict(max_num_seqs=4, page_size=4, max_model_len=64, async_scheduling=engine == "async")
    if engine == "speculative":
        kw["speculative"] = SpeculativeConfig(num_draft_tokens=3, backoff_max_steps=0)
    llm, params = LLM(checkpoint, **kw), SamplingParams(max_tokens=9, ignore_eos=True)
    expected = [o.token_ids for o in llm.generate(PROMPTS, params)]
    run = time_decode_phase(llm, PROMPTS, params, "cpu")
    assert sorted(run.outputs.values()) == sorted(expected)
    # the prompts prefill in one step, so every request has exactly one token when the span starts
    assert run.decode_tokens == len(PROMPTS) * (params.max_tokens - 1)
    assert 0 < run.decode_s < run.call_s and run.decode_rate > 0
    assert not llm.stream_deltas and not llm.take_deltas()
