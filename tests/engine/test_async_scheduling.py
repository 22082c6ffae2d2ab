"""Asynchronous plain decode (`LLM(async_scheduling=True)`): a decode step is launched before the tokens of the
step before are read back. Everything a caller sees must equal the synchronous engine's: tokens, finish
reasons, stops on a token, max_tokens, seeded sampling, aborts, memory pressure with suspensions, re-prefills
and rebalances, and a forward that fails in the middle. On a CPU the overlap buys nothing, but every path of
the bookkeeping runs."""
from __future__ import annotations

import random

import pytest

from hybridcache import LLM, SamplingParams
from tests.faults.helpers import FailOnCall, Injected
from tests.engine.arrivals import run_with_arrivals
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny}


@pytest.fixture(scope="module", params=sorted(SAVERS))
def checkpoint(request, tmp_path_factory):
    path, _ = SAVERS[request.param](tmp_path_factory.mktemp(request.param))
    return path


def workload(seed: int, n: int = 8) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 96) for _ in range(rng.randint(3, 20))] for _ in range(n)]
    params = [SamplingParams(max_tokens=rng.randint(1, 14), ignore_eos=True, temperature=rng.choice([0.0, 0.9]),
                             top_p=rng.choice([1.0, 0.9]), seed=i) for i in range(n)]
    return prompts, params


@pytest.fixture(scope="module")
def nemotron_checkpoint(tmp_path_factory):
    path, _ = nemotron.save_tiny(tmp_path_factory.mktemp("nemotron_h"))
    return path


def outputs(llm: LLM, prompts, params) -> list[tuple[list[int], str]]:
    return [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params)]


def assert_idle_and_empty(llm: LLM) -> None:
    llm.manager.check_integrity()
    assert not llm.has_unfinished() and llm.manager.requests() == []
    assert llm.manager.slot_pool.num_owned == 0 and llm.manager.page_pool.num_owned == 0


def test_async_steps_give_the_synchronous_tokens_and_finish_reasons(checkpoint):
    prompts, params = workload(0)
    sync = LLM(checkpoint, max_num_seqs=4, page_size=4, max_model_len=64)
    expected = outputs(sync, prompts, params)
    # stop on a token: one that the synchronous run produced mid-way for some request
    stop = next(toks[len(toks) // 2] for toks, _ in expected if len(toks) > 4)
    stopping = [SamplingParams(max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p, seed=p.seed,
                               stop_token_ids=[stop]) for p in params]
    expected_stops = outputs(sync, prompts, stopping)
    assert any(reason == "stop" for _, reason in expected_stops)

    llm = LLM(checkpoint, max_num_seqs=4, page_size=4, max_model_len=64, async_scheduling=True)
    llm.step_hook = llm.manager.check_integrity
    launches = []
    launch = llm._loop._launch
    llm._loop._launch = lambda step: (launches.append(len(step.generation)), launch(step))
    assert outputs(llm, prompts, params) == expected
    assert outputs(llm, prompts, stopping) == expected_stops
    assert launches, "no step ran asynchronously"
    assert_idle_and_empty(llm)


def test_logprobs_come_back_behind_the_async_tokens_as_the_synchronous_step_gives_them(checkpoint):
    """Rows asking for logprobs (with rows that do not, greedy and sampled, stops on a token) decode
    asynchronously; every token's logprob and top alternatives equal the synchronous engine's, bit for bit."""
    prompts, base = workload(3)
    params = [SamplingParams(max_tokens=p.max_tokens + 4, temperature=p.temperature, top_p=p.top_p, seed=p.seed,
                             ignore_eos=True, logprobs=[None, 0, 3][i % 3]) for i, p in enumerate(base)]
    kw = dict(max_num_seqs=4, page_size=4, max_model_len=64)
    want = LLM(checkpoint, async_scheduling=False, **kw).generate(prompts, params)
    llm = LLM(checkpoint, async_scheduling=True, **kw)
    llm.step_hook = llm.manager.check_integrity
    launches, launch = [], llm._loop._launch
    llm._loop._launch = lambda step: (launches.append(any(r.params.logprobs is not None for r in step.generation)),
                                      launch(step))
    got = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.logprobs for o in got] == [o.logprobs for o in want]
    assert any(launches), "no step with logprobs ran asynchronously"
    assert all(len(o.logprobs) == len(o.token_ids) for o, p in zip(got, params) if p.logprobs is not None)
    assert_idle_and_empty(llm)


def test_outputs_come_one_step_later_and_the_last_step_reads_them(nemotron_checkpoint):
    llm = LLM(nemotron_checkpoint, max_num_seqs=2, page_size=4, max_model_len=64, async_scheduling=True)
    rid = llm.add_request([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    finished = []
    while llm.has_unfinished():
        finished += llm.step()
        req = llm._loop.requests.get(rid)
        assert req is None or req.num_pending <= 1
    assert [o.request_id for o in finished] == [rid] and len(finished[0].token_ids) == 3
    assert_idle_and_empty(llm)


def test_an_abort_discards_the_tokens_in_flight(nemotron_checkpoint):
    checkpoint = nemotron_checkpoint
    prompts, params = workload(1, 4)
    params = [SamplingParams(max_tokens=12, ignore_eos=True, temperature=p.temperature, seed=p.seed) for p in params]
    expected = outputs(LLM(checkpoint, max_num_seqs=4, page_size=4, max_model_len=64), prompts, params)
    check_an_abort_in_flight(LLM(checkpoint, max_num_seqs=4, page_size=4, max_model_len=64, async_scheduling=True),
                             prompts, params, expected)


def check_an_abort_in_flight(llm: LLM, prompts, params, expected) -> None:
    """Abort the second request once it has 3 tokens and more on their way back: the others get `expected`'s
    tokens, it gets none, and the engine ends idle and empty."""
    llm.step_hook = llm.manager.check_integrity
    ids = [llm.add_request(p, s) for p, s in zip(prompts, params)]
    got: dict[int, list[int]] = {}
    aborted = False
    while llm.has_unfinished():
        for out in llm.step():
            got[out.request_id] = out.token_ids
        victim = llm._loop.requests.get(ids[1])
        if not aborted and victim is not None and victim.num_pending and len(victim.output) >= 3:
            llm.abort_request(ids[1])
            aborted = True
    assert aborted and ids[1] not in got
    assert [got[i] for i in ids if i != ids[1]] == [toks for i, (toks, _) in enumerate(expected) if i != 1]
    assert_idle_and_empty(llm)


def test_pressure_arrivals_aborts_and_rebalances_equal_the_unconstrained_run(checkpoint):
    prompts, params = workload(2, 10)
    params = [SamplingParams(max_tokens=p.max_tokens + 10, ignore_eos=True, temperature=p.temperature,
                             top_p=p.top_p, seed=p.seed) for p in params]
    free = LLM(checkpoint, max_num_seqs=16, max_model_len=64, page_size=4)
    expected = [toks for toks, _ in outputs(free, prompts, params)]
    sizing = free.sizing
    per = sizing.request_bytes(max(map(len, prompts)) + 24 + 1, 4)
    budget = 4 * sizing.bytes_per_slot + int((per - sizing.bytes_per_slot) * 1.3)
    llm = LLM(checkpoint, max_num_seqs=4, max_model_len=64, page_size=4, num_slots=4, device_cache_bytes=budget,
              host_cache_bytes=int(per * 1.5), max_num_batched_tokens=16, async_scheduling=True)
    llm.step_hook = llm.manager.check_integrity
    got, rebalances = run_with_arrivals(llm, prompts, params, seed=3)
    assert got == expected
    s = llm.stats
    assert rebalances > 0 and s.num_suspensions + s.num_reprefills > 0, s
    assert_idle_and_empty(llm)


@pytest.mark.parametrize("nth", [4, 7])
def test_a_failed_async_step_restarts_its_rows_and_keeps_the_step_before(nemotron_checkpoint, nth):
    checkpoint = nemotron_checkpoint
    prompts, params = workload(4, 4)
    params = [SamplingParams(max_tokens=10, ignore_eos=True, temperature=p.temperature, seed=p.seed) for p in params]
    expected = outputs(LLM(checkpoint, max_num_seqs=4, page_size=4, max_model_len=64), prompts, params)
    check_a_failed_forward(LLM(checkpoint, max_num_seqs=4, page_size=4, max_model_len=64, async_scheduling=True),
                           prompts, params, expected, nth)


def check_a_failed_forward(llm: LLM, prompts, params, expected, nth: int) -> None:
    """The `nth` forward raises once: the step raises, integrity holds, and every request still gets
    `expected`'s tokens and finish reason; the engine ends idle and empty."""
    fault = FailOnCall(llm.runner.run, nth)
    llm.runner.run = fault
    ids = [llm.add_request(p, s) for p, s in zip(prompts, params)]
    got: dict[int, tuple[list[int], str]] = {}
    raised = 0
    while llm.has_unfinished():
        try:
            outs = llm.step()
        except Injected:
            raised += 1
            llm.manager.check_integrity()
            continue
        got.update((o.request_id, (o.token_ids, o.finish_reason)) for o in outs)
    assert raised == 1 and fault.fired == 1
    assert [got[i] for i in ids] == expected
    assert_idle_and_empty(llm)


def test_prefix_caching_with_async_steps_gives_the_synchronous_run(checkpoint):
    """Asynchronous decode with prefix caching: snapshots are saved once the fed tokens are read back and
    before the next launch; tokens, hit counts and snapshots saved equal the synchronous engine's, through a
    second turn that starts where the first ended (max_tokens finishes are released before their last token
    is read)."""
    rng = random.Random(5)
    head = [rng.randrange(3, 96) for _ in range(16)]
    prompts = [head + [rng.randrange(3, 96) for _ in range(rng.randint(1, 9))] for _ in range(4)]
    params = [SamplingParams(max_tokens=rng.randint(5, 14), ignore_eos=True, temperature=0.9 * (i % 2), seed=i)
              for i in range(4)]
    runs = []
    for async_scheduling in (False, True):
        llm = LLM(checkpoint, page_size=4, max_model_len=128, max_num_seqs=4, enable_prefix_caching=True,
                  prefix_snapshot_interval=8, async_scheduling=async_scheduling)
        llm.step_hook = llm.manager.check_integrity
        first = [o.token_ids for o in llm.generate(prompts, params)]
        second = [o.token_ids for o in llm.generate([p + t + [7] for p, t in zip(prompts, first)], params)]
        s = llm.stats
        runs.append((first, second, s.prefix_cache_hits, s.num_snapshots_saved))
        assert llm.manager.requests() == [] and llm.manager.slot_pool.num_owned == 0
    assert runs[0] == runs[1]
    committed = sum(len(p) + len(t) - 1 for p, t in zip(prompts, runs[0][0]))
    assert runs[1][2] >= committed  # every second turn starts exactly where its first ended
