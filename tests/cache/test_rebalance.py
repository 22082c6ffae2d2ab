"""Rebalance in both directions keeps every live request's state, replay history included."""
import pytest
import torch

from hybridcache.cache import OutOfDeviceMemoryError

from .factory import KINDS, assert_same_state, fill_random, make_manager, run_to_generation


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("new_slots", [3, 8])  # fewer slots (more pages), then more slots (fewer pages)
def test_rebalance_keeps_live_state(kind, new_slots, device):
    mgr = make_manager(kind, device, num_slots=5, num_pages=300)
    gen = torch.Generator().manual_seed(5)
    ids = ["a", "b", "c"]
    for i, r in enumerate(ids):
        run_to_generation(mgr, r, 4 + 3 * i)
        fill_random(mgr, r, gen)
    mgr.suspend(["b"])
    slot_pad = mgr.add_dummy("pad")
    before = {r: mgr.live_state(r) for r in ids}
    old_pages = mgr.num_pages
    mgr.rebalance(new_slots)
    mgr.check_integrity()
    assert mgr.num_slots == new_slots
    assert (mgr.num_pages > old_pages) == (new_slots < 5)
    for t in mgr.state_tensors(mgr.states[0]).values():
        assert t.shape[1] == new_slots + 1  # every role resized together (dummy included)
    assert mgr.entry("pad").slot == slot_pad
    for r in ids:
        assert_same_state(before[r], mgr.live_state(r))
    mgr.resume(["b"])
    assert_same_state(before["b"], mgr.live_state("b"))
    # the request keeps working after the re-carve
    mgr.prepare_step(["a", "b", "c"], 4)
    mgr.accept([1, 2, 4])
    mgr.check_integrity()


@pytest.mark.parametrize("kind", KINDS)
def test_rebalance_that_cannot_hold_the_live_requests_changes_nothing(kind):
    mgr = make_manager(kind, num_slots=4, num_pages=40)
    gen = torch.Generator().manual_seed(6)
    for r in ["a", "b", "c"]:
        run_to_generation(mgr, r, 6)
        fill_random(mgr, r, gen)
    before = {r: mgr.live_state(r) for r in "abc"}
    slots = {r: mgr.entry(r).slot for r in "abc"}
    with pytest.raises(OutOfDeviceMemoryError):
        mgr.rebalance(2)
    mgr.check_integrity()
    assert mgr.num_slots == 4
    for r in "abc":
        assert mgr.entry(r).slot == slots[r]
        assert_same_state(before[r], mgr.live_state(r))
