"""CUDA only: pinned host tier and the ordering between the compute stream and the copy streams."""
import pytest
import torch

from .factory import make_manager, run_to_generation

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_host_tier_is_pinned():
    mgr = make_manager("mamba2", "cuda")
    assert mgr.host_tier.slot_records.is_pinned() and mgr.host_tier.page_records.is_pinned()


def test_suspend_sees_the_last_compute_write_and_the_next_forward_sees_the_resume():
    mgr = make_manager("gdn", "cuda", num_slots=2)
    run_to_generation(mgr, "a", 8)
    ssm = mgr.state_tensors("gdn")["ssm"]
    slot = mgr.entry("a").slot
    # a slow compute-stream producer: the suspend copy must wait for it, not read stale bytes
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(8):
        big = big @ big / 64.0
    value = torch.full_like(ssm[:, slot], 3.0) + big[0, 0] * 0.0
    ssm[:, slot] = value
    mgr.suspend(["a"])
    # the slot is reused at once by another request on the compute stream
    run_to_generation(mgr, "b", 4)
    mgr.state_tensors("gdn")["ssm"][:, mgr.entry("b").slot] = -1.0
    mgr.resume(["a"])
    mgr.prepare_step(["a"], 4)  # the fence: the compute stream now waits on the copies
    got = mgr.state_tensors("gdn")["ssm"][:, mgr.entry("a").slot].clone()
    mgr.accept([1])
    torch.cuda.synchronize()
    assert torch.equal(got, torch.full_like(got, 3.0))
