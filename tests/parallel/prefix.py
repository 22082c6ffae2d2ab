"""What the TP and PP prefix-caching tests share: two turns of grouped conversations, compared by tokens, hit
counts and logprobs. Tokens alone would not do: in the tiny NemotronH and Qwen3-Next checkpoints a restored
snapshot of zeros changes no greedy token (a recurrent state moves the logprobs by about 1e-2, the arithmetic
of another split by about 1e-6)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from tests.engine.test_prefix_caching import grouped

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True, logprobs=1)
PROMPTS = grouped(4, groups=2, per=3, shared=20)
KW = dict(page_size=4, max_model_len=128, max_num_seqs=4, speculative=SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=2))
CACHED = dict(enable_prefix_caching=True, prefix_snapshot_interval=8, device_cache_bytes=1 << 22)


class Turns(NamedTuple):
    tokens: list[list[int]]
    logprobs: list[list[float]]  # each generated token's
    counts: tuple[int, int, int]  # prefix-cache (queries, hits, snapshots saved)


def two_turns(llm: LLM, rebalance: bool = False) -> Turns:
    """A first turn of PROMPTS, a rebalance (the snapshot rows keep their ids), then each conversation's second
    turn."""
    first = llm.generate(PROMPTS, GREEDY)
    if rebalance:
        llm.rebalance(llm.manager.num_slots - 1)
    second = llm.generate([p + o.token_ids + [7, 8] for p, o in zip(PROMPTS, first)], GREEDY)
    s = llm.stats
    return Turns([o.token_ids for o in first + second], [[lp.logprob for lp in o.logprobs] for o in first + second],
                 (s.prefix_cache_queries, s.prefix_cache_hits, s.num_snapshots_saved))


def check_parallel_prefix_caching(path, **parallel) -> LLM:
    """With `parallel` sizes, prefix caching gives one process's tokens and hit counts (prefix caching on), and its
    logprobs to 1e-4 (on and off), across a rebalance, with check_integrity() after every step; the later members
    of each group and every second turn hit. Returns the parallel LLM, closed."""
    off = two_turns(LLM(path, **KW))
    one = two_turns(LLM(path, **KW, **CACHED))
    llm = LLM(path, **KW, **CACHED, parallel_timeout_s=60, **parallel)
    try:
        llm.step_hook = llm.manager.check_integrity
        got = two_turns(llm, rebalance=True)
    finally:
        llm.close()
    assert one.tokens == off.tokens and got.tokens == off.tokens
    assert got.counts == one.counts and got.counts[1] >= 16 * 4 + 8 * len(PROMPTS), got.counts
    for want in (one, off):
        torch.testing.assert_close(torch.tensor(sum(got.logprobs, [])), torch.tensor(sum(want.logprobs, [])),
                                   atol=1e-4, rtol=0)
    return llm


def pressured_cached(path, spec: SpeculativeConfig, host_requests: float, **parallel) -> LLM:
    """A caching LLM of four slots whose device cache (the whole model's) holds about 1.3 requests' pages and whose
    host tier `host_requests` requests: suspensions, evictions and, with room on the host, spills."""
    sizing = LLM(path, max_model_len=64, page_size=4, speculative=spec).sizing
    per = sizing.request_bytes(16 + 12 + 10 + 3, 4)  # grouped(shared=16): the longest prompt is 28 tokens
    budget = 5 * sizing.bytes_per_slot + int((per - sizing.bytes_per_slot) * 1.3)
    return LLM(path, max_num_seqs=4, speculative=spec, max_model_len=64, page_size=4, num_slots=4,
               device_cache_bytes=budget, host_cache_bytes=int(per * host_requests), max_num_batched_tokens=16,
               enable_prefix_caching=True, prefix_snapshot_interval=8, **parallel)
