"""The seeds' cases, for every recurrent kind: state survives suspension bit for bit, wherever it lands."""
import pytest
import torch

from hybridcache.cache import InvalidTransitionError, Status

from .factory import KINDS, assert_same_state, fill_random, make_manager, run_to_generation


@pytest.mark.parametrize("kind", KINDS)
def test_resume_in_another_slot_restores_every_role(kind, device):
    mgr = make_manager(kind, device)
    gen = torch.Generator().manual_seed(1)
    run_to_generation(mgr, "a", 9)
    fill_random(mgr, "a", gen)
    before, old_slot = mgr.live_state("a"), mgr.entry("a").slot
    mgr.suspend(["a"])
    mgr.check_integrity()
    # the slot goes to another request, which overwrites every role of it
    run_to_generation(mgr, "b", 6)
    assert mgr.entry("b").slot == old_slot
    fill_random(mgr, "b", gen)
    b_before = mgr.live_state("b")
    mgr.resume(["a"])
    mgr.check_integrity()
    assert mgr.entry("a").slot != old_slot
    assert_same_state(before, mgr.live_state("a"))
    assert_same_state(b_before, mgr.live_state("b"))


@pytest.mark.parametrize("kind", KINDS)
def test_resume_in_the_same_slot_restores_every_role(kind, device):
    mgr = make_manager(kind, device)
    gen = torch.Generator().manual_seed(2)
    run_to_generation(mgr, "a", 7)
    fill_random(mgr, "a", gen)
    before, old_slot = mgr.live_state("a"), mgr.entry("a").slot
    mgr.suspend(["a"])
    mgr.resume(["a"])
    mgr.check_integrity()
    assert mgr.entry("a").slot == old_slot
    assert_same_state(before, mgr.live_state("a"))


@pytest.mark.parametrize("kind", KINDS)
def test_resumed_as_context_starts_from_zero(kind, device):
    mgr = make_manager(kind, device)
    gen = torch.Generator().manual_seed(3)
    run_to_generation(mgr, "a", 9)
    fill_random(mgr, "a", gen)
    mgr.suspend(["a"])
    # a second request dirties the free slots so a zero state cannot come from a clean pool
    run_to_generation(mgr, "b", 3)
    fill_random(mgr, "b", gen)
    mgr.free("b")
    mgr.reprefill("a")
    assert mgr.status("a") == Status.WAITING
    assert mgr.planner.host_slot_pool.num_owned == 0 and mgr.planner.host_page_pool.num_owned == 0
    step = mgr.prepare_step(["a"], [5])
    assert bool(step.fresh[0]) and int(step.cached_lens[0]) == 0
    state = mgr.live_state("a")
    assert all(not t.any() for k, t in state.items() if not k.startswith("attn")), "stale state after re-prefill"
    mgr.accept()
    mgr.start_generation("a")
    # at its next generation step the bookkeeping is still that of a fresh request
    step = mgr.prepare_step(["a"], [4])
    assert int(step.cached_lens[0]) == 5 and not bool(step.fresh[0])
    tensors = mgr.state_tensors(mgr.states[0])
    for name in ("pnat", "buf_idx", "pend_n"):
        if name in tensors:
            assert int(tensors[name][0, mgr.entry("a").slot]) == 0
    mgr.accept([2])
    mgr.check_integrity()


@pytest.mark.parametrize("kind", KINDS)
def test_freed_while_suspended_keeps_nothing(kind, device):
    mgr = make_manager(kind, device)
    run_to_generation(mgr, "a", 9)
    mgr.suspend(["a"])
    assert mgr.planner.host_slot_pool.num_owned == 1 and mgr.planner.host_page_pool.num_owned == 3
    mgr.free("a")
    mgr.check_integrity()
    assert mgr.requests() == []
    assert mgr.planner.host_slot_pool.num_owned == 0 and mgr.planner.host_page_pool.num_owned == 0
    assert mgr.slot_pool.num_owned == 0 and mgr.page_pool.num_owned == 0


@pytest.mark.parametrize("kind", KINDS)
def test_dummy_suspend_is_refused_and_its_slot_kept(kind, device):
    mgr = make_manager(kind, device)
    slot = mgr.add_dummy("pad")
    run_to_generation(mgr, "a", 4)
    with pytest.raises(InvalidTransitionError, match="dummy"):
        mgr.suspend(["pad"])
    with pytest.raises(InvalidTransitionError, match="dummy"):
        mgr.suspend(["a", "pad"])  # a batch containing a dummy changes nothing either
    assert mgr.status("a") == Status.GENERATION
    assert mgr.entry("pad").slot == slot and mgr.status("pad") == Status.DUMMY
    step = mgr.prepare_step(["a", "pad"], [1, 1])
    assert int(step.slots[1]) == slot and (step.page_table[1] == -1).all()
    mgr.accept([1, 1])
    mgr.check_integrity()
    assert mgr.planner.host_slot_pool.num_owned == 0


@pytest.mark.parametrize("kind", KINDS)
def test_many_requests_suspended_together_land_in_shuffled_slots(kind, device):
    mgr = make_manager(kind, device, num_slots=6, num_pages=64, host_requests=6)
    gen = torch.Generator().manual_seed(4)
    ids = [f"r{i}" for i in range(5)]
    for i, r in enumerate(ids):
        run_to_generation(mgr, r, 3 + 2 * i)
        fill_random(mgr, r, gen)
    before = {r: mgr.live_state(r) for r in ids}
    mgr.suspend(ids[::2])
    run_to_generation(mgr, "intruder", 2)
    fill_random(mgr, "intruder", gen)
    mgr.suspend(ids[1::2])
    mgr.resume(ids[1::2][::-1] + ids[::2])
    mgr.check_integrity()
    for r in ids:
        assert_same_state(before[r], mgr.live_state(r))


def test_a_model_without_attention_holds_no_pages(device):
    from hybridcache.cache import CacheConfig, HybridCacheManager

    from .factory import make_state

    state = make_state("mamba2")
    mgr = HybridCacheManager([state], None, CacheConfig(device_bytes=1 << 16, host_bytes=1 << 16, num_slots=2, device=device))
    gen = torch.Generator().manual_seed(7)
    run_to_generation(mgr, "a", 50)
    fill_random(mgr, "a", gen)
    step = mgr.prepare_step(["a"], 4)
    assert step.page_table.shape[0] == 1 and (step.page_table == -1).all()
    mgr.accept([4])
    before = mgr.live_state("a")
    mgr.suspend(["a"])
    mgr.resume(["a"])
    mgr.check_integrity()
    assert mgr.num_pages == 0 and mgr.entry("a").pages == []
    assert_same_state(before, mgr.live_state("a"))
