"""Snapshots through the store: a save folds the replay history into the checkpoint and copies the conv
window, a restore zeroes the request's slot and copies the snapshot in, and a failed save or a failed
step leaves the prefix index and every reference count as before."""
from __future__ import annotations

import pytest
import torch

from hybridcache.cache import CacheConfig, HybridCacheManager
from hybridcache.states import KVPages
from tests.cache.factory import KINDS, PAGE_SIZE, fill_random, make_state


def manager(kind: str) -> HybridCacheManager:
    state = make_state(kind, dtype=torch.float32)
    pages = KVPages(1, num_kv_heads=2, head_dim=4, page_size=PAGE_SIZE, dtype=torch.float32)
    return HybridCacheManager([state], pages, CacheConfig(device_bytes=1 << 22, page_size=PAGE_SIZE, num_slots=3,
                                                          num_snapshot_slots=2, snapshot_interval=8))


def prefill(mgr: HybridCacheManager, rid, tokens: list[int], gen: torch.Generator | None = None):
    """Admit `rid` at its cached prefix and prefill to its first keep; returns the match."""
    mgr.add_request(rid)
    m = mgr.planner.match_prefix(rid, tokens, len(tokens))
    chunk = (m.keeps[0] if m.keeps else len(tokens)) - m.tokens
    assert mgr.planner.allocate([rid], chunk, prefix=m)
    mgr.execute(mgr.planner.plan_step([rid], [chunk]))
    if gen is not None:
        mgr.accept()  # commit first: fill_random writes the committed pages
        fill_random(mgr, rid, gen)
    else:
        mgr.accept()
    return m


def index_state(mgr: HybridCacheManager):
    p = mgr.planner
    return (sorted((n.key, n.page, n.snapshot) for n in p.prefix.index.nodes.values()),
            [p.page_pool.refcount(i) for i in range(p.page_pool.total)],
            [p.prefix.snap_pool.refcount(i) for i in range(p.prefix.snap_pool.total)])


@pytest.mark.parametrize("kind", KINDS)
def test_save_folds_the_history_and_restore_copies_it_into_a_zeroed_slot(kind):
    mgr = manager(kind)
    tokens = list(range(10))
    prefill(mgr, "a", tokens, torch.Generator().manual_seed(0))
    state, module = mgr.state_tensors(mgr.states[0]), mgr.states[0]
    slot = torch.tensor([mgr.entry("a").slot])
    if kind == "kda":
        from hybridcache.ops.kda import kda_effective_state as eff
        want = [eff(state["ssm"][l], state["pend_k"][l], state["pend_g"][l], state["pend_v"][l], state["pend_beta"][l],
                    state["pend_n"][0], slot) for l in range(module.num_layers)]
    else:
        want = [module.effective_state(state, l, slot) for l in range(module.num_layers)]
    assert int((state["pnat"] if kind != "kda" else state["pend_n"])[0, slot]) >= 0
    assert mgr.save_snapshots(lambda r: tokens) == 1
    row = mgr.planner.prefix.row(next(iter(mgr.planner.prefix.index.snapshot_nodes())).snapshot)
    for l in range(module.num_layers):
        torch.testing.assert_close(state["ssm"][l, row], want[l][0], rtol=0, atol=0)
    assert torch.equal(state["conv"][:, row], state["conv"][:, slot[0]])

    m = prefill(mgr, "b", tokens[:8] + [50, 51, 52])
    assert (m.tokens, m.snapshot >= 0) == (8, True)
    b = mgr.entry("b").slot
    assert torch.equal(state["ssm"][:, b], state["ssm"][:, row]) and torch.equal(state["conv"][:, b], state["conv"][:, row])
    for name, t in state.items():
        if name not in module.snapshot_roles():
            assert not t[:, b].any(), f"{name} of a restored slot is not zero"
    assert mgr.entry("b").pages[:2] == mgr.entry("a").pages[:2]  # the prefix's pages are shared
    mgr.check_integrity()


@pytest.mark.parametrize("kind", ["mamba2"])
def test_a_failed_save_or_step_leaves_the_index_and_reference_counts_as_before(kind, monkeypatch):
    mgr = manager(kind)
    tokens = list(range(10))
    prefill(mgr, "a", tokens, torch.Generator().manual_seed(1))
    mgr.save_snapshots(lambda r: tokens)
    before = index_state(mgr)

    mgr.add_request("b")
    m = mgr.planner.match_prefix("b", tokens[:8] + [60, 61], 10)
    assert mgr.planner.allocate(["b"], 2, prefix=m)
    plan = mgr.planner.plan_step(["b"], [2])
    mgr.execute(plan)
    assert mgr.abort_step() == ["b"]  # the forward failed
    assert index_state(mgr) == before
    mgr.check_integrity()

    prefill(mgr, "c", tokens[:8] + [70, 71, 72, 73, 74, 75, 76, 77, 78])  # will save at 16
    snap = index_state(mgr)

    def broken(plan):
        raise RuntimeError("copy failed")

    monkeypatch.setattr(mgr.store, "save_snapshots", broken)
    with pytest.raises(RuntimeError, match="copy failed"):
        mgr.save_snapshots(lambda r: tokens[:8] + [70, 71, 72, 73, 74, 75, 76, 77, 78])
    assert index_state(mgr) == snap
    mgr.check_integrity()
