"""The engine end to end on tiny Nemotron-H checkpoints: equal to transformers' generate token for token,
plain, with n-gram speculation, and under memory pressure that forces suspensions, resumes, re-prefills."""
from __future__ import annotations

import json
import random

import pytest
import torch

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.engine.errors import InvalidRequestError, RequestTooLargeError
from hybridcache.models.errors import UnsupportedModelTypeError
from tests.models.helpers import save_tiny

PROMPTS = [
    [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4],
    [9, 10, 11, 9, 10, 11, 9, 10],
    [20, 21, 22, 23, 24, 25, 26],
    [30, 31, 30, 31, 30, 31, 30, 31, 30, 31, 30],
    [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56],
    [5, 60, 5, 61, 5, 60, 5],
]
MAX_TOKENS = 16
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
CONFIGS = {
    "M*-E": dict(),
    "MM*M-": dict(hybrid_override_pattern="MM*M-", n_groups=1, chunk_size=8, conv_kernel=3),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    path, hf = save_tiny(tmp_path_factory.mktemp(request.param.replace("*", "a")), **CONFIGS[request.param])
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = [hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
               for p in PROMPTS]
    return path, ref


def pressured(path, speculative, host_requests: float, max_num_seqs: int = 4) -> LLM:
    """An LLM with a slot for each of `max_num_seqs` requests but pages for about 1.6 at full length."""
    probe = LLM(path, max_num_seqs=1, speculative=speculative, device_cache_bytes=1 << 20, page_size=4)
    longest = max(map(len, PROMPTS)) + MAX_TOKENS + 4
    slot, per = probe.sizing.bytes_per_slot, probe.device_bytes_needed(longest)
    device = max_num_seqs * slot + int((per - slot) * 1.6)
    return LLM(path, max_num_seqs=max_num_seqs, speculative=speculative, device_cache_bytes=device,
               host_cache_bytes=int(per * host_requests), max_num_batched_tokens=24, page_size=4,
               num_slots=max_num_seqs)


@pytest.mark.parametrize("k", [0, 3])
def test_equals_transformers(checkpoint, k):
    path, ref = checkpoint
    llm = LLM(path, speculative=SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=k) if k else None)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == ref
    if k:
        assert llm.stats.num_draft_tokens > 0 and llm.stats.num_accepted_tokens > 0


@pytest.mark.parametrize("k", [0, 3])
def test_equals_transformers_under_memory_pressure(checkpoint, k):
    path, ref = checkpoint
    llm = pressured(path, SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=k) if k else None, host_requests=4)
    llm.step_hook = llm.manager.check_integrity
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == ref
    s = llm.stats
    assert s.num_suspensions > 0 and s.num_resumes > 0, s
    assert s.bytes_to_host > 0 and s.bytes_to_host == s.bytes_to_device
    assert llm.manager.requests() == [] and llm.manager.num_free_slots == llm.manager.num_slots


def test_reserve_policy_never_preempts_and_gives_the_same_tokens(checkpoint):
    path, ref = checkpoint
    probe = pressured(path, SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3), host_requests=4)
    llm = LLM(path, max_num_seqs=4, speculative=SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3),
              device_cache_bytes=probe.manager.config.device_bytes, num_slots=4, page_size=4,
              max_num_batched_tokens=24, scheduling_policy="reserve")
    llm.step_hook = llm.manager.check_integrity
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == ref
    assert llm.stats.num_suspensions == 0 and llm.stats.num_reprefills == 0


def test_full_host_tier_falls_back_to_reprefill(checkpoint):
    path, ref = checkpoint
    llm = pressured(path, SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3), host_requests=0)
    llm.step_hook = llm.manager.check_integrity
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == ref
    assert llm.stats.num_reprefills > 0 and llm.stats.num_suspensions == 0


def test_random_arrivals_under_pressure_equal_the_unconstrained_run(checkpoint):
    path, _ = checkpoint
    rng = random.Random(0)
    prompts = [[rng.randrange(96) for _ in range(rng.randint(3, 20))] for _ in range(12)]
    params = [SamplingParams(max_tokens=rng.randint(4, MAX_TOKENS), ignore_eos=True,
                             temperature=rng.choice([0.0, 0.8]), top_k=rng.choice([0, 20]), seed=i)
              for i in range(len(prompts))]
    free = LLM(path, max_num_seqs=16, speculative=SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=2))
    expected = [o.token_ids for o in free.generate(prompts, params)]

    llm = pressured(path, SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=2), host_requests=1.5)
    llm.step_hook = llm.manager.check_integrity
    pending = list(range(len(prompts)))
    ids: dict[int, int] = {}
    outputs: dict[int, list[int]] = {}
    while pending or llm.has_unfinished():
        for _ in range(rng.randint(0, 2)):  # random arrivals between steps
            if pending:
                i = pending.pop(0)
                ids[llm.add_request(prompts[i], params[i])] = i
        for out in llm.step():
            outputs[ids[out.request_id]] = out.token_ids
    assert [outputs[i] for i in range(len(prompts))] == expected
    s = llm.stats
    assert s.num_suspensions + s.num_reprefills > 0, s
    llm.manager.check_integrity()
    assert llm.manager.requests() == []
    assert llm.manager.planner.host_slot_pool.num_owned == 0 and llm.manager.page_pool.num_owned == 0


def test_bad_input_is_refused_and_the_others_run(checkpoint, tmp_path):
    path, ref = checkpoint
    llm = LLM(path, max_model_len=64)
    good = llm.add_request(PROMPTS[0], GREEDY)
    with pytest.raises(InvalidRequestError, match="empty prompt"):
        llm.add_request([], GREEDY)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        llm.add_request([1, 2, 96], GREEDY)
    with pytest.raises(InvalidRequestError, match="exceeds max_model_len"):
        llm.add_request(list(range(60)), GREEDY)
    with pytest.raises(InvalidRequestError, match="empty prompt"):
        llm.generate([PROMPTS[1], []], GREEDY)  # nothing of the batch is queued
    mine = llm.generate([PROMPTS[1]], GREEDY)  # runs beside the request added before, returns only its own
    assert len(mine) == 1 and mine[0].token_ids == ref[1] and mine[0].finish_reason == "length"
    done = []
    while llm.has_unfinished() or not done:
        done += llm.step()  # the earlier request's output, finished inside generate() or after it
    assert [o.request_id for o in done] == [good] and done[0].token_ids == ref[0]

    small = LLM(path, device_cache_bytes=llm.device_bytes_needed(24), page_size=4)
    with pytest.raises(RequestTooLargeError, match="device cache holds"):
        small.add_request(list(range(20)), GREEDY)

    cfg = json.loads((path / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "no_such_model"}))
    with pytest.raises(UnsupportedModelTypeError, match="nemotron_h"):
        LLM(bad)


@pytest.mark.parametrize("k", [0, 3])
def test_stop_tokens_and_eos_end_a_request_where_they_first_appear(checkpoint, k):
    path, ref = checkpoint
    spec = SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=k) if k else None
    stop = ref[0][5]
    cut = ref[0][: ref[0].index(stop) + 1]
    llm = LLM(path, speculative=spec)
    out = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(stop,), ignore_eos=True))
    assert out[0].token_ids == cut
    llm.eos_token_id = stop  # the checkpoint's eos behaves the same unless ignore_eos
    out = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=MAX_TOKENS))
    assert out[0].token_ids == cut
    out = llm.generate([PROMPTS[0]], GREEDY)
    assert out[0].token_ids == ref[0]


def test_a_failed_forward_commits_nothing_and_the_next_step_runs(checkpoint, monkeypatch):
    path, ref = checkpoint
    llm = LLM(path)
    llm.add_request(PROMPTS[0], GREEDY)
    real = type(llm.model).forward
    calls = {"n": 0}

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device lost")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(llm.model), "forward", flaky)
    done = []
    with pytest.raises(RuntimeError, match="device lost"):
        while llm.has_unfinished():
            done += llm.step()
    llm.manager.check_integrity()
    while llm.has_unfinished():
        done += llm.step()
    assert done[0].token_ids == ref[0]


@pytest.mark.parametrize("prompt, fragment", [
    ([1, 2.0, 3], "token ids must be ints"), ([1, True, 3], "token ids must be ints"), ([1, "2"], "token ids must be ints"),
    ([[1, 2]], "token ids must be ints"), (b"hi", "a prompt is text or a list"), (7, "a prompt is text or a list"),
])
def test_token_ids_must_be_ints(checkpoint, prompt, fragment):
    path, _ = checkpoint
    llm = LLM(path)
    with pytest.raises(InvalidRequestError, match=fragment):
        llm.add_request(prompt, GREEDY)
    assert not llm.has_unfinished()


@pytest.mark.parametrize("kw", [dict(max_model_len=0), dict(max_num_seqs=0), dict(page_size=2.5), dict(dtype="fp8"),
                                dict(max_num_batched_tokens=True), dict(num_slots=0)])
def test_constructor_refuses_bad_sizes_with_a_typed_error(checkpoint, kw):
    from hybridcache.engine.errors import InvalidParamsError

    with pytest.raises(InvalidParamsError):
        LLM(checkpoint[0], **kw)
