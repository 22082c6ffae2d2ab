"""Prefix caching end to end: outputs equal caching off for the three families (greedy and seeded
sampling, n-gram speculation, multi-turn, under pressure with suspensions and rebalances), and hits
counted exactly on constructed workloads. `check_integrity()` runs after every step."""
from __future__ import annotations

import random

import pytest

from hybridcache import LLM, SamplingParams
from hybridcache.engine.errors import InvalidParamsError
from tests.engine.arrivals import run_with_arrivals
from tests.engine.families import SPEC, checkpoint  # noqa: F401 (checkpoint is a fixture)
from tests.models import helpers as nemotron


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path, _ = nemotron.save_tiny(tmp_path_factory.mktemp("nemotron"))
    return path


def grouped(seed: int, groups: int = 2, per: int = 3, shared: int = 20) -> list[list[int]]:
    rng = random.Random(seed)
    heads = [[rng.randrange(3, 96) for _ in range(shared)] for _ in range(groups)]
    return [h + [rng.randrange(3, 96) for _ in range(rng.randint(1, 12))] for h in heads for _ in range(per)]


def mixed_params(n: int) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.0 if i % 2 else 0.9, seed=i)
            for i in range(n)]


def cached_llm(path, **kw) -> LLM:
    llm = LLM(path, page_size=4, max_model_len=128, enable_prefix_caching=True, prefix_snapshot_interval=8,
              device_cache_bytes=kw.pop("device_cache_bytes", 1 << 22), **kw)
    llm.step_hook = llm.manager.check_integrity
    return llm


def pressured(path, prompts, params, spec, host_requests: float) -> tuple[list[list[int]], LLM]:
    """(the prompts' tokens from an LLM with room for all of them, a caching LLM of four slots whose device
    cache holds about 1.3 requests' pages and whose host tier `host_requests` requests)."""
    free = LLM(path, max_num_seqs=16, speculative=spec, max_model_len=64, page_size=4)
    expected = [o.token_ids for o in free.generate(prompts, params)]
    sizing = free.sizing
    per = sizing.request_bytes(max(map(len, prompts)) + 10 + 3, 4)
    budget = 5 * sizing.bytes_per_slot + int((per - sizing.bytes_per_slot) * 1.3)
    return expected, cached_llm(path, max_num_seqs=4, speculative=spec, num_slots=4, device_cache_bytes=budget,
                                host_cache_bytes=int(per * host_requests), max_num_batched_tokens=16)


@pytest.mark.parametrize("spec", [None, SPEC], ids=["plain", "ngram"])
def test_on_equals_off_with_shared_prefixes_and_a_second_turn(checkpoint, spec):
    prompts = grouped(0)
    params = mixed_params(len(prompts))
    off = LLM(checkpoint, page_size=4, max_model_len=128, max_num_seqs=4, speculative=spec)
    on = cached_llm(checkpoint, max_num_seqs=4, speculative=spec)
    want = [o.token_ids for o in off.generate(prompts, params)]
    assert [o.token_ids for o in on.generate(prompts, params)] == want
    assert on.stats.prefix_cache_hits >= 16 * 2  # each group's later requests start past the shared prefix

    turn2 = [p + w + [7, 8, 9] for p, w in zip(prompts, want)]
    hits = on.stats.prefix_cache_hits
    assert [o.token_ids for o in on.generate(turn2, params)] == [o.token_ids for o in off.generate(turn2, params)]
    assert on.stats.prefix_cache_hits - hits >= 8 * len(turn2)  # each turn starts past the first turn's prefix
    on.manager.check_integrity()
    assert on.manager.requests() == [] and on.manager.slot_pool.num_owned == 0


def test_on_equals_off_under_pressure_with_suspensions_and_rebalances(checkpoint):
    prompts = grouped(3, groups=3, per=3, shared=16)
    params = mixed_params(len(prompts))
    expected, llm = pressured(checkpoint, prompts, params, SPEC, host_requests=1.5)
    outputs, rebalances = run_with_arrivals(llm, prompts, params, seed=2)
    assert outputs == expected
    s = llm.stats
    assert rebalances > 0 and s.num_suspensions + s.num_reprefills > 0 and s.prefix_cache_hits > 0, s
    assert llm.manager.requests() == [] and llm.manager.slot_pool.num_owned == 0


def test_hits_are_counted_exactly_at_the_boundaries_they_come_from(tiny):
    """page 4, interval 8. A (24 shared + 6) saves at 24 (its prompt's last boundary) and, generating, at 32;
    B (24 shared + 10) hits 24; C (A's prompt and output + 1) hits 32, generated tokens included."""
    rng = random.Random(5)
    shared = [rng.randrange(3, 96) for _ in range(24)]
    a, b = shared + [rng.randrange(3, 96) for _ in range(6)], shared + [rng.randrange(3, 96) for _ in range(10)]
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    off = LLM(tiny, page_size=4, max_model_len=128)
    on = cached_llm(tiny)
    out_a = on.generate([a], params)[0].token_ids
    assert out_a == off.generate([a], params)[0].token_ids
    assert (on.stats.prefix_cache_queries, on.stats.prefix_cache_hits, on.stats.num_snapshots) == (30, 0, 2)
    assert on.generate([b], params)[0].token_ids == off.generate([b], params)[0].token_ids
    assert (on.stats.prefix_cache_queries, on.stats.prefix_cache_hits) == (30 + 34, 24)
    c = a + out_a + [11]
    assert on.generate([c], params)[0].token_ids == off.generate([c], params)[0].token_ids
    assert (on.stats.prefix_cache_queries, on.stats.prefix_cache_hits) == (30 + 34 + 34, 24 + 32)


def test_the_second_request_of_a_group_sent_at_once_waits_for_the_first_ones_snapshot(tiny):
    """Both arrive in one step: the second is deferred while the first prefills to the branch point (16),
    saves there, and the second then starts from it."""
    rng = random.Random(6)
    shared = [rng.randrange(3, 96) for _ in range(16)]
    prompts = [shared + [rng.randrange(3, 96) for _ in range(10)] for _ in range(2)]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    on = cached_llm(tiny)
    got = [o.token_ids for o in on.generate(prompts, params)]
    assert got == [o.token_ids for o in LLM(tiny, page_size=4, max_model_len=128).generate(prompts, params)]
    assert (on.stats.prefix_cache_queries, on.stats.prefix_cache_hits) == (52, 16)


def test_a_full_batch_still_asks_an_in_flight_leader_to_save_at_the_branch_point(tiny):
    """Three groups, their requests interleaved, three seats: the first of each group prefill (16 tokens a
    step) while the others wait without a seat. The scheduler's look-ahead asks each leader to save at the
    end of the shared 40 tokens, which its own keeps (its prompt's end) would pass; so every follower hits
    all 40 (without the look-ahead half of them hit nothing)."""
    rng = random.Random(0)
    heads = [[rng.randrange(3, 96) for _ in range(40)] for _ in range(3)]
    prompts = [heads[g] + [rng.randrange(3, 96) for _ in range(rng.randint(20, 30))] for _ in range(3) for g in range(3)]
    llm = cached_llm(tiny, max_num_seqs=3, max_num_batched_tokens=16)
    llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    assert llm.stats.prefix_cache_hits == 3 * 2 * 40


def test_a_small_snapshot_pool_evicts_and_stays_exact(tiny):
    prompts = grouped(9, groups=4, per=3, shared=16)
    params = mixed_params(len(prompts))
    off = LLM(tiny, page_size=4, max_model_len=128, max_num_seqs=2)
    on = cached_llm(tiny, max_num_seqs=2, host_cache_bytes=0)
    prefix = on.manager.planner.prefix
    from hybridcache.cache.id_pool import IdPool

    prefix.snap_pool = IdPool(2)  # two of its rows only, and no host tier to spill to: every new snapshot evicts
    assert [o.token_ids for o in on.generate(prompts, params)] == [o.token_ids for o in off.generate(prompts, params)]
    assert on.stats.prefix_cache_evictions > 0 and on.stats.prefix_cache_hits > 0


def test_a_branch_point_outlives_the_snapshots_its_requests_save_later(tiny):
    """Three snapshot rows and no host tier: every running request saves generation and end snapshots, which
    are worth less than the group's branch point, so they never evict it — every request after a group's
    first starts from the shared prefix (the ceiling), and tokens equal caching off."""
    prompts = grouped(21, groups=3, per=4, shared=16)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    on = cached_llm(tiny, max_num_seqs=4, host_cache_bytes=0)
    from hybridcache.cache.id_pool import IdPool

    on.manager.planner.prefix.snap_pool = IdPool(3)  # a row for each group's branch point, none to spare
    got = [o.token_ids for o in on.generate(prompts, params)]
    assert got == [o.token_ids for o in LLM(tiny, page_size=4, max_model_len=128).generate(prompts, params)]
    assert on.stats.prefix_cache_hits == 3 * 3 * 16
    assert (on.stats.num_snapshots_saved, on.stats.prefix_cache_evictions) == (3, 0)  # the later ones found no row


def test_the_default_host_tier_holds_spilled_prefixes(tiny, monkeypatch):
    """No host budget given: the device's, or with prefix caching `PREFIX_HOST_FACTOR` times it, at most a
    quarter of physical memory and never below the device's; a given one is kept."""
    from hybridcache.engine import policy

    device = 1 << 22
    kw = dict(page_size=4, max_model_len=128, device_cache_bytes=device)
    assert LLM(tiny, **kw).manager.config.host_bytes == device
    assert LLM(tiny, enable_prefix_caching=True, **kw).manager.config.host_bytes == policy.PREFIX_HOST_FACTOR * device
    assert LLM(tiny, enable_prefix_caching=True, host_cache_bytes=3 << 20, **kw).manager.config.host_bytes == 3 << 20
    pages = {"SC_PHYS_PAGES": (6 << 20) // 4096, "SC_PAGE_SIZE": 4096}  # a quarter of this machine: 1.5 MiB
    monkeypatch.setattr(policy.os, "sysconf", pages.__getitem__)
    assert policy.default_host_bytes(device, True) == device
    pages["SC_PHYS_PAGES"] = (32 << 20) // 4096  # 8 MiB
    assert policy.default_host_bytes(device, True) == 2 * device


def test_bad_interval_is_refused(tiny):
    with pytest.raises(InvalidParamsError, match="prefix_snapshot_interval"):
        LLM(tiny, page_size=4, enable_prefix_caching=True, prefix_snapshot_interval=6)


@pytest.mark.parametrize("spec", [None, SPEC], ids=["plain", "ngram"])
def test_on_equals_off_with_spills_to_the_host_tier_and_suspensions(checkpoint, spec):
    """A device cache too small to keep the groups' prefixes: evicted snapshots and their pages spill to a
    host tier that suspended requests share; tokens equal caching off."""
    prompts = grouped(4, groups=4, per=3, shared=16)
    params = mixed_params(len(prompts))
    expected, llm = pressured(checkpoint, prompts, params, spec, host_requests=6)
    order = [i for g in range(3) for i in (g, g + 3, g + 6, g + 9)]  # groups interleave: chains go cold and come back
    outs = llm.generate([prompts[i] for i in order], [params[i] for i in order])
    assert [o.token_ids for o in outs] == [expected[i] for i in order]
    s = llm.stats
    assert s.prefix_cache_spills > 0 and s.prefix_cache_host_hits > 0 and s.num_suspensions > 0, s
    llm.manager.check_integrity()
    assert llm.manager.requests() == [] and llm.manager.slot_pool.num_owned == 0


def _cache_state(planner):
    pc = planner.prefix
    nodes = sorted((n.key, n.page, n.host_page, n.snapshot, n.host_snapshot) for n in pc.index.nodes.values())
    pools = [(p.num_free, [p.refcount(i) for i in range(p.total)]) for p in
             (planner.page_pool, planner.host_page_pool, planner.host_slot_pool, pc.snap_pool)]
    return nodes, pools, dict(pc.stats)


def test_a_failed_spill_or_unspill_copy_changes_nothing(tiny, monkeypatch):
    prompts = grouped(11, groups=3, per=1, shared=16)
    on = cached_llm(tiny, max_num_seqs=2, host_cache_bytes=1 << 22)
    first = on.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True))[0].token_ids
    mgr, planner = on.manager, on.manager.planner
    assert planner.prefix.snap_pool.num_owned > 0
    real = mgr.store.copy

    def broken(plan):
        raise RuntimeError("copy failed")

    before = _cache_state(planner)
    monkeypatch.setattr(mgr.store, "copy", broken)
    assert mgr.spill(snapshots=2) == 0
    assert _cache_state(planner) == before
    mgr.check_integrity()
    monkeypatch.setattr(mgr.store, "copy", real)
    assert mgr.spill(snapshots=10, pages=10) > 0 and planner.prefix.stats["spills"] > 0
    mgr.check_integrity()

    mgr.add_request("again")
    tokens = prompts[0] + first + [5, 6, 7, 8, 9]  # the first request's next turn: its end was spilled
    match = planner.match_prefix("again", tokens, len(tokens))
    assert match.unspill and match.tokens > 0
    before = _cache_state(planner)
    monkeypatch.setattr(mgr.store, "copy", broken)
    fallback = mgr.unspill(match)
    assert not fallback.unspill and _cache_state(planner) == before
    monkeypatch.setattr(mgr.store, "copy", real)
    back = mgr.unspill(planner.match_prefix("again", tokens, len(tokens)))
    assert not back.unspill and back.tokens == match.tokens and planner.prefix.stats["host_hits"] == 1
    mgr.check_integrity()
    assert mgr.allocate(["again"], len(tokens) - back.tokens, prefix=back)
    mgr.check_integrity()


def test_a_failed_unspill_falls_back_to_a_partial_page_left_on_the_device(tiny, monkeypatch):
    """Turn 2 of a conversation ends at 45 and is spilled; a request of its first 42 tokens ends inside a
    page (a partial node at 42, kept on the device). Turn 3 matches turn 2's end on the host; when that
    copy fails, it starts from the partial page at 42 (without the request's tokens the fallback could
    match no partial page, only turn 2's prompt snapshot at 40)."""
    rng = random.Random(14)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    on = cached_llm(tiny, max_num_seqs=2, host_cache_bytes=1 << 22)
    mgr, planner = on.manager, on.manager.planner
    turn1 = [rng.randrange(3, 96) for _ in range(27)]
    turn2 = turn1 + on.generate([turn1], params)[0].token_ids + [rng.randrange(3, 96) for _ in range(13)]
    turn3 = turn2 + on.generate([turn2], params)[0].token_ids + [5, 6, 7, 8, 9]
    on.generate([turn2[:42]], SamplingParams(max_tokens=1, ignore_eos=True))  # its end: 42, inside page 11
    end42 = next(n for n in planner.prefix.index.nodes.values() if n.fill and n.num_tokens(4) == 42)
    assert mgr.spill(snapshots=10, pages=10, protect=(end42,)) > 0
    assert end42.snapshot >= 0 and end42.host_page < 0

    mgr.add_request("turn3")
    match = planner.match_prefix("turn3", turn3, len(turn3))
    assert match.unspill and match.tokens == len(turn2) + 2

    def broken(plan):
        raise RuntimeError("copy failed")

    monkeypatch.setattr(mgr.store, "copy", broken)
    fallback = mgr.unspill(match, turn3)
    assert not fallback.unspill and fallback.tokens == 42 and fallback.nodes[-1] is end42
    assert mgr.allocate(["turn3"], len(turn3) - fallback.tokens, prefix=fallback)
    mgr.check_integrity()


def test_reset_forgets_every_cached_prefix_on_both_tiers_and_the_next_run_starts_cold(tiny):
    """Device and spilled entries are dropped (every pool id back, not counted as evictions); the same
    prompts then hit exactly what they hit the first time, with the same tokens. Refused mid-step."""
    from hybridcache.cache import InvalidTransitionError

    prompts = grouped(13, groups=3, per=2, shared=16)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    on = cached_llm(tiny, max_num_seqs=2, host_cache_bytes=1 << 22)
    mgr, planner = on.manager, on.manager.planner
    first = [o.token_ids for o in on.generate(prompts, params)]
    hits, evictions = on.stats.prefix_cache_hits, on.stats.prefix_cache_evictions
    assert hits > 0 and mgr.spill(snapshots=1) > 0  # one entry on the host tier, the rest on the device
    assert planner.prefix.snap_pool.num_owned > 0 and planner.host_slot_pool.num_owned > 0

    mgr.add_request("mid-step")
    mgr.allocate(["mid-step"], 4)
    plan = planner.plan_step(["mid-step"], [4])
    before = _cache_state(planner)
    with pytest.raises(InvalidTransitionError, match="pending"):
        mgr.reset_prefix_cache()
    assert _cache_state(planner) == before
    planner.abort_step(plan)
    mgr.free("mid-step")

    assert on.reset_prefix_cache() is True
    mgr.check_integrity()
    assert planner.prefix.snap_pool.num_owned == 0 and planner.host_slot_pool.num_owned == 0
    assert planner.page_pool.num_owned == 0 and planner.host_page_pool.num_owned == 0
    assert on.stats.prefix_cache_evictions == evictions and on.stats.num_snapshots == 0
    assert [o.token_ids for o in on.generate(prompts, params)] == first
    assert on.stats.prefix_cache_hits == 2 * hits
    assert LLM(tiny, page_size=4, max_model_len=128).reset_prefix_cache() is False  # caching off


def test_a_suspend_drops_spilled_entries_before_it_is_refused(tiny):
    prompts = grouped(12, groups=3, per=1, shared=16)
    on = cached_llm(tiny, max_num_seqs=2, host_cache_bytes=1 << 22)
    on.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True))
    mgr, planner = on.manager, on.manager.planner
    assert mgr.spill(snapshots=10, pages=10) > 0
    hs = planner.host_slot_pool
    taken = hs.allocate(hs.num_free)  # the host tier is full of spilled entries
    mgr.add_request("r")
    mgr.prepare_step(["r"], 9)
    mgr.accept()
    mgr.start_generation("r")
    mgr.prepare_step(["r"], 1)
    mgr.accept([1])
    spilled = len(list(planner.prefix.index.host_nodes()))
    mgr.suspend(["r"])
    assert len(list(planner.prefix.index.host_nodes())) == spilled - 1 and planner.prefix.stats["evictions"] >= 1
    hs.release(taken)
    mgr.check_integrity()


@pytest.mark.parametrize("spec", [None, SPEC], ids=["plain", "ngram"])
def test_a_next_turn_starts_exactly_where_the_last_ended(checkpoint, spec):
    """A finished request saves its committed end inside a page (a partial node); two different next turns,
    admitted together, both start there, each writing its own copy of that page; tokens equal caching off."""
    prompt = [(7 * i) % 90 + 3 for i in range(13)]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    off = LLM(checkpoint, page_size=4, max_model_len=128, speculative=spec)
    on = cached_llm(checkpoint, max_num_seqs=2, speculative=spec)
    first = on.generate([prompt], params)[0].token_ids
    assert first == off.generate([prompt], params)[0].token_ids
    end = len(prompt) + len(first) - 1  # committed: the last sampled token is not fed yet
    assert end % 4 and end % 8  # inside a page, off the snapshot interval
    turns = [prompt + first + [9, 8, 7], prompt + first + [5]]
    hits = on.stats.prefix_cache_hits
    got = [o.token_ids for o in on.generate(turns, [params, params])]
    assert got == [o.token_ids for o in off.generate(turns, [params, params])]
    assert on.stats.prefix_cache_hits - hits == 2 * end
    on.manager.check_integrity()
    assert on.manager.requests() == [] and on.manager.slot_pool.num_owned == 0
