"""Bad input gets a typed error with a clear message and changes nothing."""
import pytest
import torch

from hybridcache.cache import (
    BudgetTooSmallError,
    CacheConfig,
    DoubleFreeError,
    DuplicateRequestError,
    HostTierFullError,
    HybridCacheManager,
    InvalidTransitionError,
    LayoutError,
    OutOfDeviceMemoryError,
    RoleSpec,
    Status,
    UnknownRequestError,
)
from hybridcache.states import KDAState, KVPages, Mamba2State, GDNState

from .factory import assert_same_state, fill_random, make_manager, run_to_generation


def snapshot(mgr):
    return (
        {r: (mgr.entry(r).status, mgr.entry(r).slot, list(mgr.entry(r).pages), mgr.entry(r).host_slot,
             list(mgr.entry(r).host_pages), mgr.entry(r).num_tokens) for r in mgr.requests()},
        mgr.slot_pool.num_free, mgr.page_pool.num_free,
        mgr.planner.host_slot_pool.num_free, mgr.planner.host_page_pool.num_free,
    )


@pytest.fixture
def mgr():
    m = make_manager("mamba2", host_requests=1)
    run_to_generation(m, "gen", 6)
    m.add_request("wait")
    fill_random(m, "gen", torch.Generator().manual_seed(0))
    return m


def test_unknown_id(mgr):
    before = snapshot(mgr)
    for call in (lambda: mgr.suspend(["nope"]), lambda: mgr.resume(["nope"]), lambda: mgr.free("nope"),
                 lambda: mgr.reprefill("nope"), lambda: mgr.prepare_step(["gen", "nope"], 1)):
        with pytest.raises(UnknownRequestError, match="unknown request 'nope'"):
            call()
    assert snapshot(mgr) == before
    mgr.check_integrity()


def test_double_free(mgr):
    mgr.free("gen")
    before = snapshot(mgr)
    with pytest.raises(DoubleFreeError, match="already freed"):
        mgr.free("gen")
    assert snapshot(mgr) == before


def test_duplicate_add(mgr):
    with pytest.raises(DuplicateRequestError):
        mgr.add_request("gen")


def test_suspend_of_a_request_that_is_not_generating(mgr):
    before = snapshot(mgr)
    with pytest.raises(InvalidTransitionError, match="WAITING"):
        mgr.suspend(["wait"])
    with pytest.raises(InvalidTransitionError, match="WAITING"):
        mgr.suspend(["gen", "wait"])  # the valid one is not moved either
    assert snapshot(mgr) == before
    mgr.suspend(["gen"])
    with pytest.raises(InvalidTransitionError, match="SUSPENDED"):
        mgr.suspend(["gen"])


def test_resume_of_a_request_that_is_not_suspended(mgr):
    before = snapshot(mgr)
    with pytest.raises(InvalidTransitionError, match="not SUSPENDED"):
        mgr.resume(["gen"])
    assert snapshot(mgr) == before


def test_full_host_tier_leaves_the_request_as_it_was(mgr):
    gen = torch.Generator().manual_seed(9)
    run_to_generation(mgr, "other", 5)
    fill_random(mgr, "other", gen)
    mgr.suspend(["gen"])  # the host tier holds one request
    state = mgr.live_state("other")
    before = snapshot(mgr)
    with pytest.raises(HostTierFullError, match="host tier"):
        mgr.suspend(["other"])
    assert snapshot(mgr) == before
    assert mgr.status("other") == Status.GENERATION
    assert_same_state(state, mgr.live_state("other"))
    mgr.reprefill("other")  # what the engine falls back to
    mgr.check_integrity()


def test_device_full_step_changes_nothing():
    m = make_manager("gdn", num_slots=2, num_pages=4)
    run_to_generation(m, "a", 8)
    m.add_request("b")
    before = snapshot(m)
    with pytest.raises(OutOfDeviceMemoryError, match="pages"):
        m.prepare_step(["a", "b"], [1, 12])
    assert snapshot(m) == before
    m.check_integrity()


def test_step_of_a_suspended_request_and_repeated_rows(mgr):
    mgr.suspend(["gen"])
    with pytest.raises(InvalidTransitionError, match="suspended"):
        mgr.prepare_step(["gen"], 1)
    with pytest.raises(ValueError, match="twice"):
        mgr.prepare_step(["wait", "wait"], 1)


def test_accept_counts_out_of_range(mgr):
    mgr.prepare_step(["gen"], 4)
    with pytest.raises(ValueError, match="5 valid tokens of 4"):
        mgr.accept([5])
    mgr.accept([4])
    assert mgr.entry("gen").num_tokens == 10


def test_kda_with_unequal_sections():
    with pytest.raises(LayoutError, match="section widths"):
        KDAState(2, num_heads=2, head_dim=8, conv_kernel=4, sections=(16, 16, 32))


def test_draft_length_above_hist():
    with pytest.raises(LayoutError, match="replay history"):
        Mamba2State(1, 4, 4, 2, 8, 4, num_draft_tokens=8, hist=6)
    with pytest.raises(LayoutError, match="replay history"):
        GDNState(1, 2, 2, 4, 4, 4, num_draft_tokens=20, hist=16)


def test_budget_too_small_for_one_request():
    state = Mamba2State(2, 4, 4, 2, 8, 4)
    pages = KVPages(1, 2, 4, page_size=4, dtype=torch.float32)
    with pytest.raises(BudgetTooSmallError, match="cannot hold one request"):
        HybridCacheManager([state], pages, CacheConfig(device_bytes=1024, page_size=4))


def test_bad_roles():
    with pytest.raises(LayoutError):
        RoleSpec("x", 1, (3, 4), torch.float32, buffered_by="idx", buffer_dim=0)
    with pytest.raises(LayoutError):
        RoleSpec("x", 0, (2,), torch.float32)


def test_lifecycle_ops_while_a_step_is_pending(mgr):
    mgr.prepare_step(["gen"], 1)
    with pytest.raises(InvalidTransitionError, match="pending"):
        mgr.suspend(["gen"])
    mgr.accept([1])
    mgr.suspend(["gen"])


def test_freed_ids_are_remembered_for_double_free_but_bounded():
    from hybridcache.cache.planner import FREED_REMEMBERED, Planner

    planner = Planner(4, True, num_slots=2, num_pages=8, num_dummies=0, host_slots=0, host_pages=0)
    for i in range(FREED_REMEMBERED + 100):
        planner.add(i)
        planner.free(i)
    assert len(planner._freed) == FREED_REMEMBERED
    with pytest.raises(DoubleFreeError):
        planner.free(FREED_REMEMBERED + 99)
    with pytest.raises(UnknownRequestError):  # forgotten: an unknown id now
        planner.free(0)
