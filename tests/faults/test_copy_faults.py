"""A copy that fails after its first run of rows — of a suspend, a resume, a rebalance's copy back — for every
recurrent kind, on the manager directly. The operation is a transaction: afterwards integrity holds, every
request's status, ids and live bytes are what they were bit for bit, and the same operation succeeds once the
fault is gone. When a rebalance cannot even restore the old carving (a double fault), the live requests restart
from their tokens (StateLostError), holding nothing, and the suspended ones keep their host state."""
from __future__ import annotations

import pytest
import torch

import hybridcache.cache.copy_engine as copy_engine
from hybridcache.cache import StateLostError, Status
from tests.cache.factory import KINDS, assert_same_state, fill_random, make_manager, run_to_generation

from .helpers import FailOnCall, Injected


def holdings(mgr, rid) -> tuple:
    e = mgr.entry(rid)
    return e.status, e.slot, list(e.pages), e.host_slot, list(e.host_pages), e.num_tokens


def pool_counts(mgr) -> list[tuple[int, int]]:
    p = mgr.planner
    return [(pool.total, pool.num_free) for pool in (p.slot_pool, p.page_pool, p.host_slot_pool, p.host_page_pool)]


def dummy_rows_are_zero(mgr) -> bool:
    d = mgr.config.num_dummy_slots
    return all(not t[:, :d].view(torch.uint8).any() for t in mgr.device_tier.slots.values())


def setup(kind: str, seed: int):
    """Live requests "a" (9 tokens) and "c" (6), "b" (7) suspended, a dummy; random bytes in every role.
    Returns the manager, every request's live state and holdings."""
    mgr = make_manager(kind, num_slots=5, num_pages=120)
    gen = torch.Generator().manual_seed(seed)
    for rid, n in (("a", 9), ("b", 7), ("c", 6)):
        run_to_generation(mgr, rid, n)
        fill_random(mgr, rid, gen)
    mgr.suspend(["b"])
    mgr.add_dummy("pad")
    assert dummy_rows_are_zero(mgr)
    return mgr, {r: mgr.live_state(r) for r in "abc"}, {r: holdings(mgr, r) for r in "abc"}


def assert_unchanged(mgr, states, held, rids="abc") -> None:
    mgr.check_integrity()
    for r in rids:
        assert holdings(mgr, r) == held[r], r
        assert_same_state(states[r], mgr.live_state(r))


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_suspend_copy_changes_nothing_and_the_retry_succeeds(kind, monkeypatch):
    mgr, states, held = setup(kind, 1)
    pools = pool_counts(mgr)
    fault = FailOnCall(copy_engine._pack, 2)  # the slot rows are packed; the pages fail
    monkeypatch.setattr(copy_engine, "_pack", fault)
    with pytest.raises(Injected):
        mgr.suspend(["a"])
    assert fault.fired == 1 and fault.calls == 2
    assert_unchanged(mgr, states, held)
    assert pool_counts(mgr) == pools
    monkeypatch.undo()
    mgr.suspend(["a"])
    mgr.check_integrity()
    assert mgr.status("a") == Status.SUSPENDED
    assert_same_state(states["a"], mgr.live_state("a"))
    mgr.resume(["a"])
    assert_same_state(states["a"], mgr.live_state("a"))


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_resume_copy_changes_nothing_and_the_retry_succeeds(kind, monkeypatch):
    mgr, states, held = setup(kind, 2)
    pools = pool_counts(mgr)
    fault = FailOnCall(copy_engine._scatter, 2)  # the slot rows land in the reserved slot; the pages fail
    monkeypatch.setattr(copy_engine, "_scatter", fault)
    with pytest.raises(Injected):
        mgr.resume(["b"])
    assert fault.fired == 1 and fault.calls == 2
    assert_unchanged(mgr, states, held)
    assert pool_counts(mgr) == pools
    monkeypatch.undo()
    mgr.resume(["b"])
    mgr.check_integrity()
    assert mgr.status("b") == Status.GENERATION
    assert_same_state(states["b"], mgr.live_state("b"))
    mgr.prepare_step(["a", "b", "c"], 4)  # the resumed request runs
    mgr.accept([1, 2, 4])
    mgr.check_integrity()


@pytest.mark.parametrize("new_slots", [3, 6])  # more pages, fewer pages
@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_rebalance_copy_back_restores_the_old_carving(kind, new_slots, monkeypatch):
    mgr, states, held = setup(kind, 3)
    pools, old = pool_counts(mgr), (mgr.num_slots, mgr.num_pages)
    assert mgr.can_rebalance(new_slots)
    fault = FailOnCall(copy_engine._scatter, 2)  # the slot rows are copied back; the pages fail
    monkeypatch.setattr(copy_engine, "_scatter", fault)
    with pytest.raises(Injected):
        mgr.rebalance(new_slots)
    assert fault.fired == 1
    assert (mgr.num_slots, mgr.num_pages) == old
    assert all(t.shape[1] == old[0] + 1 for t in mgr.device_tier.slots.values())
    assert_unchanged(mgr, states, held)
    assert pool_counts(mgr) == pools
    assert dummy_rows_are_zero(mgr)
    assert mgr.stats["rebalances"] == 0
    monkeypatch.undo()
    mgr.rebalance(new_slots)
    mgr.check_integrity()
    assert mgr.num_slots == new_slots
    for r in "abc":
        assert_same_state(states[r], mgr.live_state(r))


@pytest.mark.parametrize("kind", KINDS)
def test_a_rebalance_that_cannot_restore_loses_only_the_live_requests_state(kind, monkeypatch):
    mgr, states, held = setup(kind, 4)
    old = (mgr.num_slots, mgr.num_pages)
    fault = FailOnCall(copy_engine._scatter, 2, times=None)  # the copy back and the restore both fail
    monkeypatch.setattr(copy_engine, "_scatter", fault)
    with pytest.raises(StateLostError) as err:
        mgr.rebalance(3)
    assert isinstance(err.value.__cause__, Injected)
    mgr.check_integrity()
    assert (mgr.num_slots, mgr.num_pages) == old
    for r in "ac":
        assert holdings(mgr, r) == (Status.WAITING, -1, [], -1, [], 0)
    assert_unchanged(mgr, states, held, "b")  # the suspended request lives on the host tier: untouched
    p = mgr.planner
    assert p.slot_pool.num_owned == 0 and p.page_pool.num_owned == 0
    assert p.host_slot_pool.num_owned == 1 and p.host_page_pool.num_owned == len(held["b"][4])
    assert mgr.stats["aborted_rows"] == 2
    assert dummy_rows_are_zero(mgr)
    monkeypatch.undo()
    # the restarted requests prefill again from a zero state; the suspended one comes back intact
    step = mgr.prepare_step(["a", "c"], [9, 6])
    assert step.fresh.tolist() == [True, True] and step.cached_lens.tolist() == [0, 0]
    mgr.accept()
    mgr.resume(["b"])
    assert_same_state(states["b"], mgr.live_state("b"))
    mgr.check_integrity()
