"""The engine core (a background thread over an LLM: deltas, abort) and the facade's contract around it:
one generate() caller at a time, only its own outputs, finish reasons, logprobs, stop strings, eos ids
and generation_config.json defaults, dtype "auto", nothing kept after a request ends."""
from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.engine.core import EngineCore, QueueFullError
from hybridcache.engine.errors import InvalidRequestError
from tests.models.helpers import save_tiny

PROMPTS = [[5, 17, 3, 42, 8, 8, 13, 21], [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [60, 61, 62]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path, _ = save_tiny(tmp_path_factory.mktemp("tiny"))
    return path


def collect(core: EngineCore, prompt, params, timeout: float = 30.0):
    deltas, done = [], threading.Event()

    def sink(d):
        deltas.append(d)
        if d.finished:
            done.set()

    ticket = core.submit(prompt, params, sink)
    return ticket, deltas, done


def test_core_deltas_add_up_to_generate_and_abort_frees_the_state(tiny):
    params = [SamplingParams(max_tokens=9, temperature=0.7 * (i % 2), seed=i, ignore_eos=True, logprobs=2)
              for i in range(3)]
    want = LLM(tiny).generate(PROMPTS, params)
    llm = LLM(tiny, max_num_seqs=2)
    llm.step_hook = lambda: time.sleep(0.005)  # (on the core's thread) nothing finishes before the checks below
    core = EngineCore(llm, max_queued=4).start()
    try:
        with pytest.raises(InvalidRequestError, match="already running"):
            llm.generate([PROMPTS[0]])  # the core holds the LLM
        runs = [collect(core, p, sp) for p, sp in zip(PROMPTS, params)]
        long_ticket, long_deltas, long_done = collect(core, PROMPTS[0], SamplingParams(max_tokens=500, ignore_eos=True))
        with pytest.raises(QueueFullError):
            core.submit(PROMPTS[0], params[0], lambda d: None)
        for (_, deltas, done), w in zip(runs, want):
            assert done.wait(30)
            assert [t for d in deltas for t in d.token_ids] == w.token_ids
            got = [x for d in deltas for x in d.logprobs]
            assert [x.token_id for x in got] == w.token_ids
            assert [x.logprob for x in got] == pytest.approx([x.logprob for x in w.logprobs], abs=1e-5)
            assert [d.finish_reason for d in deltas] == [None] * (len(deltas) - 1) + ["length"]
        while not long_deltas:
            time.sleep(0.01)
        core.abort(long_ticket)
        assert long_done.wait(30) and long_deltas[-1].finish_reason == "abort"
        assert sum(len(d.token_ids) for d in long_deltas) < 500
    finally:
        core.shutdown()
    llm.manager.check_integrity()
    assert llm.manager.requests() == [] and llm.manager.planner.slot_pool.num_owned == 0
    assert llm.generate([PROMPTS[0]], params[0])[0].token_ids == want[0].token_ids  # handed back


def test_generate_refuses_a_second_caller_and_returns_only_its_own(tiny):
    llm = LLM(tiny)
    errors = []

    def progress(done, total):
        try:
            llm.generate([PROMPTS[1]])
        except InvalidRequestError as e:
            errors.append(str(e))

    other = llm.add_request(PROMPTS[2], SamplingParams(max_tokens=30, ignore_eos=True))
    outs = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=4, ignore_eos=True), progress=progress)
    assert [o.request_id for o in outs] != [other] and len(outs) == 1 and outs[0].finish_reason == "length"
    assert errors and "already running" in errors[0]
    done = []
    while llm.has_unfinished() or not done:
        done += llm.step()
    assert [o.request_id for o in done] == [other]


def test_logprobs_with_speculation_equal_plain_and_nothing_is_kept(tiny):
    p = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=3)
    plain = LLM(tiny).generate(PROMPTS, p)
    llm = LLM(tiny, speculative=SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3))
    spec = llm.generate(PROMPTS, p)
    for a, b in zip(plain, spec):
        assert a.token_ids == b.token_ids
        assert [x.logprob for x in a.logprobs] == pytest.approx([x.logprob for x in b.logprobs], abs=1e-5)
        assert all(len(x.top) == 3 and x.top[0][0] == x.token_id for x in b.logprobs)  # greedy
    assert LLM(tiny).generate([PROMPTS[0]], SamplingParams(max_tokens=3))[0].logprobs is None
    zero = llm.generate(PROMPTS, SamplingParams(max_tokens=4, ignore_eos=True, logprobs=0))  # the chosen only
    for a, b in zip(plain, zero):
        assert [x.logprob for x in b.logprobs] == pytest.approx([x.logprob for x in a.logprobs[:4]], abs=1e-5)
        assert all(x.top == () for x in b.logprobs)
    for _ in range(20):
        llm.generate(PROMPTS, SamplingParams(max_tokens=2))
    loop = llm._loop
    assert loop.requests == {} and loop.held == [] and loop.ready == [] and loop.deltas == []


def test_generation_config_eos_ids_defaults_and_dtype_auto(tiny, tmp_path):
    want = LLM(tiny).generate([PROMPTS[0]], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    path = tmp_path / "ckpt"
    path.mkdir()
    for f in tiny.iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((path / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg["eos_token_id"] = 95
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [95, want[6]], "max_new_tokens": 12}))
    llm = LLM(path, dtype="auto")
    assert llm.dtype == torch.bfloat16 and llm.eos_token_ids == [95, want[6]] and llm.eos_token_id == 95
    assert llm.default_params.max_tokens == 12
    llm = LLM(path)
    out = llm.generate([PROMPTS[0]])[0]  # generation_config's max_new_tokens; its second eos id stops it
    assert out.token_ids == want[: want.index(want[6]) + 1] and out.finish_reason == "stop"
    with pytest.raises(InvalidRequestError, match="need a tokenizer"):
        llm.generate([PROMPTS[0]], SamplingParams(stop=("x",)))
