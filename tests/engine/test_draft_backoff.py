"""Speculation back-off (`SpeculativeConfig.backoff_max_steps`, `drafter.DraftBackoff`): a request whose drafts
keep being rejected stops proposing for a while, and the steps in which no row proposes run as plain decode —
asynchronous where the engine schedules so. Greedy tokens equal plain decoding whatever the drafts; seeded
sampling gives the same tokens synchronous and asynchronous (the back-off depends on the committed steps only)."""
from __future__ import annotations

import random

import pytest

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.engine.drafter import DraftBackoff
from hybridcache.engine.params import InvalidParamsError
from hybridcache.engine.request import Request
from tests.engine.arrivals import run_with_arrivals
from tests.engine.families import checkpoint  # noqa: F401  (the three families' fixture)

K = 3


def test_the_rule_doubles_the_pause_after_each_miss_and_an_accept_resets_it():
    backoff, req = DraftBackoff(max_steps=5), Request(0, [1, 2], SamplingParams(), (), 0)
    pauses = []
    for _ in range(4):  # four verify steps in a row that accept nothing
        assert backoff.drafts(req)
        backoff.after_step(req, num_drafts=K, num_accepted=0)
        pauses.append(req.draft_skip)
        while not backoff.drafts(req):
            backoff.after_step(req, num_drafts=0, num_accepted=0)  # a plain step while it backs off
    assert pauses == [1, 3, 5, 5]  # 2^misses - 1, capped at max_steps
    backoff.after_step(req, num_drafts=K, num_accepted=1)
    assert (req.draft_misses, req.draft_skip) == (0, 0)
    backoff.after_step(req, num_drafts=0, num_accepted=0)  # a step with no proposal changes nothing
    assert (req.draft_misses, req.draft_skip) == (0, 0)
    off = DraftBackoff(max_steps=0)
    off.after_step(req, num_drafts=K, num_accepted=0)
    assert off.drafts(req) and req.draft_misses == 0


def test_a_negative_limit_is_refused():
    with pytest.raises(InvalidParamsError, match="backoff_max_steps"):
        SpeculativeConfig(backoff_max_steps=-1)


def workload(seed: int, n: int = 6, sampled: bool = False) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 96) for _ in range(rng.randint(3, 20))] for _ in range(n)]
    params = [SamplingParams(max_tokens=rng.randint(20, 30), ignore_eos=True,
                             temperature=rng.choice([0.0, 0.9]) if sampled else 0.0, seed=i) for i in range(n)]
    return prompts, params


def wrong_drafts(llm: LLM) -> None:
    """Proposals that are never the greedy choice often enough: the last token shifted (k of them)."""
    llm.drafter.propose = lambda tokens: [(tokens[-1] + 7) % llm.vocab_size] * K


def count_launches(llm: LLM) -> list[int]:
    """Calls of the asynchronous launch (plain decode steps overlapped with the host), counted."""
    calls, launch = [0], llm._loop._launch

    def counted(step):
        calls[0] += 1
        return launch(step)
    llm._loop._launch = counted
    return calls


def spec_llm(path, backoff: int, async_scheduling: bool, **kw) -> LLM:
    llm = LLM(path, max_num_seqs=4, page_size=4, max_model_len=64, async_scheduling=async_scheduling,
              speculative=SpeculativeConfig(num_draft_tokens=K, backoff_max_steps=backoff), **kw)
    llm.step_hook = llm.manager.check_integrity
    return llm


def tokens(outs) -> list[list[int]]:
    return [o.token_ids for o in outs]


def test_backing_off_keeps_greedy_tokens_drafts_less_and_runs_plain_steps_asynchronously(checkpoint):  # noqa: F811
    prompts, params = workload(0)
    expected = tokens(LLM(checkpoint, max_num_seqs=4, page_size=4, max_model_len=64).generate(prompts, params))
    always = spec_llm(checkpoint, 0, async_scheduling=True)
    wrong_drafts(always)
    assert tokens(always.generate(prompts, params)) == expected
    for asynchronous in (False, True):
        llm = spec_llm(checkpoint, 8, asynchronous)
        wrong_drafts(llm)
        launches = count_launches(llm)
        assert tokens(llm.generate(prompts, params)) == expected
        s = llm.stats
        assert 0 < s.num_draft_tokens < always.stats.num_draft_tokens / 2, (s.num_draft_tokens, always.stats)
        assert (launches[0] > 0) == asynchronous, launches  # plain steps overlapped only where asked
        assert llm.manager.slot_pool.num_owned == 0 and not llm.has_unfinished()


def test_the_default_config_backs_off(checkpoint):  # noqa: F811
    """Rejected drafts cost a verify step each: by default a request stops drafting after misses."""
    prompts, params = workload(3)
    drafted = []
    for spec in (SpeculativeConfig(num_draft_tokens=K), SpeculativeConfig(num_draft_tokens=K, backoff_max_steps=0)):
        llm = LLM(checkpoint, max_num_seqs=4, page_size=4, max_model_len=64, speculative=spec)
        wrong_drafts(llm)
        llm.generate(prompts, params)
        drafted.append(llm.stats.num_draft_tokens)
    assert SpeculativeConfig().backoff_max_steps == 16
    assert 0 < drafted[0] < drafted[1] / 2, drafted


def test_accepted_drafts_never_back_off(checkpoint):  # noqa: F811
    """Drafts from the greedy reference itself: every step of every row drafts, with and without back-off."""
    prompts, params = workload(1)
    plain = LLM(checkpoint, max_num_seqs=4, page_size=4, max_model_len=64)
    refs = {tuple(p): o.token_ids for p, o in zip(prompts, plain.generate(prompts, params))}

    def oracle(toks: list[int]) -> list[int]:
        for prompt, cont in refs.items():
            n = len(toks) - len(prompt)
            if n >= 0 and tuple(toks[: len(prompt)]) == prompt:
                return cont[n : n + K]
        return []
    drafted = []
    for backoff in (0, 8):
        llm = spec_llm(checkpoint, backoff, async_scheduling=True)
        llm.drafter.propose = oracle
        assert tokens(llm.generate(prompts, params)) == list(refs.values())
        drafted.append((llm.stats.num_draft_tokens, llm.stats.num_accepted_tokens))
    assert drafted[0] == drafted[1] and drafted[0][1] > 0, drafted


def test_seeded_sampling_is_the_same_synchronous_and_asynchronous(checkpoint):  # noqa: F811
    prompts, params = workload(2, sampled=True)
    got = []
    for asynchronous in (False, True):
        llm = spec_llm(checkpoint, 6, asynchronous)
        wrong_drafts(llm)
        got.append((tokens(llm.generate(prompts, params)), llm.stats.num_draft_tokens))
    assert got[0] == got[1]


def test_backing_off_under_pressure_with_arrivals_and_rebalances(checkpoint):  # noqa: F811
    prompts, params = workload(3, n=10)
    free = LLM(checkpoint, max_num_seqs=16, max_model_len=64, page_size=4)
    expected = tokens(free.generate(prompts, params))
    sizing = spec_llm(checkpoint, 8, True).sizing  # a speculative slot holds the replay history too
    per = sizing.request_bytes(max(map(len, prompts)) + 30 + K + 1, 4)
    budget = 4 * sizing.bytes_per_slot + int((per - sizing.bytes_per_slot) * 1.3)
    llm = spec_llm(checkpoint, 8, True, num_slots=4, device_cache_bytes=budget, host_cache_bytes=int(per * 1.5),
                   max_num_batched_tokens=16)
    wrong_drafts(llm)
    launches = count_launches(llm)
    got, rebalances = run_with_arrivals(llm, prompts, params, seed=4)
    assert got == expected
    s = llm.stats
    assert launches[0] > 0 and rebalances > 0 and s.num_suspensions + s.num_reprefills > 0, (launches, s)
    llm.manager.check_integrity()
    assert llm.manager.slot_pool.num_owned == 0 and not llm.has_unfinished()

