"""A suspended request keeps its shared pages on the device (a reference each, nothing copied) and resumes
bit for bit, a rebalance in between included; `check_integrity()` catches a broken reference count."""
from __future__ import annotations

import pytest
import torch

from hybridcache.cache import IntegrityError
from hybridcache.cache import CacheConfig, HybridCacheManager
from hybridcache.states import KVPages
from tests.cache.factory import KINDS, PAGE_SIZE, fill_random, make_state
from tests.cache.test_prefix_snapshots import prefill

A = list(range(10))
B = A[:8] + [50, 51, 52]  # shares A's first 8 tokens (two pages of 4)


def manager(kind: str) -> HybridCacheManager:
    pages = KVPages(1, num_kv_heads=2, head_dim=4, page_size=PAGE_SIZE, dtype=torch.float32)
    cfg = CacheConfig(device_bytes=1 << 22, host_bytes=1 << 22, page_size=PAGE_SIZE, num_slots=3,
                      num_snapshot_slots=2, snapshot_interval=8)
    return HybridCacheManager([make_state(kind, dtype=torch.float32)], pages, cfg)


def shared_pair(kind: str):
    """`a` prefilled and snapshotted at 8; `b` admitted there, generating, with random bytes in its slot and
    private page (its shared pages keep a's bytes)."""
    mgr = manager(kind)
    gen = torch.Generator().manual_seed(3)
    prefill(mgr, "a", A, gen)
    assert mgr.save_snapshots(lambda r: A) == 1
    m = prefill(mgr, "b", B)
    assert m.tokens == 8
    mgr.start_generation("b")
    shared = {n: t[:, mgr.entry("b").pages[:2]].clone() for n, t in mgr.page_tensors().items()}
    fill_random(mgr, "b", gen)
    for n, t in mgr.page_tensors().items():  # fill_random wrote every live page: put the shared ones back
        t[:, mgr.entry("b").pages[:2]] = shared[n]
    return mgr


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rebalance", [False, True], ids=["plain", "rebalanced"])
def test_suspend_keeps_shared_pages_and_resumes_bit_for_bit(kind, rebalance):
    mgr = shared_pair(kind)
    p, b = mgr.planner, mgr.entry("b")
    want, shared = mgr.live_state("b"), b.pages[:2]
    assert p.kept_pages(b) == 2
    moved = mgr.suspend(["b"])
    mgr.check_integrity()
    assert (b.pages, len(b.host_pages)) == (shared, 1)  # only the private page went to the host
    assert moved == sum(r.live_row_bytes for r in mgr.slot_roles) + mgr.sizing.bytes_per_page
    assert [p.page_pool.refcount(i) for i in shared] == [3, 3]  # the index, a, and suspended b
    assert_same(mgr.live_state("b"), want)

    mgr.free("a")  # the index and b still hold the shared pages
    mgr.add_request("c")  # takes b's old slot and page and scribbles over them
    mgr.prepare_step(["c"], [7])
    mgr.accept()
    fill_random(mgr, "c", torch.Generator().manual_seed(9))
    if rebalance:
        mgr.rebalance(mgr.num_slots - 1)  # renumbers every page, b's kept ones too
        shared = b.pages
    mgr.check_integrity()
    mgr.resume(["b"])
    mgr.check_integrity()
    assert b.pages[:2] == shared
    assert_same(mgr.live_state("b"), want)


def test_a_broken_reference_count_is_caught():
    mgr = shared_pair("mamba2")
    p, b = mgr.planner, mgr.entry("b")
    mgr.check_integrity()
    p.page_pool.share([b.pages[0]])  # a reference nobody holds
    with pytest.raises(IntegrityError, match="holders but refcount"):
        mgr.check_integrity()
    p.page_pool.release([b.pages[0]])
    snap = next(iter(p.prefix.index.snapshot_nodes())).snapshot
    p.prefix.snap_pool.release([snap])  # the index still names it: in use and free at once
    with pytest.raises(IntegrityError, match="snapshots"):
        mgr.check_integrity()
