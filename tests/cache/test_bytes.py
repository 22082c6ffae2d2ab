"""Byte accounting: a suspend moves exactly the live bytes; about half a whole-slot copy for the history."""
import math

import pytest

from .factory import KINDS, make_manager, run_to_generation


@pytest.mark.parametrize("kind", KINDS)
def test_suspend_moves_the_live_bytes(kind, device):
    mgr = make_manager(kind, device)
    run_to_generation(mgr, "a", 9)  # 3 pages of 4 tokens
    moved = mgr.suspend(["a"])
    live_slot = 0
    for r in mgr.slot_roles:
        live_shape = r.shape if r.buffered_by is None else r.shape[: r.buffer_dim] + r.shape[r.buffer_dim + 1 :]
        live_slot += r.layers * math.prod(live_shape) * r.itemsize
    page = sum(r.layers * math.prod(r.shape) * r.itemsize for r in mgr.page_roles)
    assert moved == live_slot + 3 * page
    assert mgr.stats["bytes_to_host"] == moved
    assert mgr.resume(["a"]) == moved
    history = [r for r in mgr.slot_roles if r.buffered_by]
    if history:
        whole = sum(r.row_bytes for r in history)
        assert sum(r.live_row_bytes for r in history) * 2 == whole


def test_sizing_reports_bytes_per_role():
    mgr = make_manager("mamba2")
    by_role = mgr.sizing.bytes_per_slot_by_role
    # ssm: 2 layers x 4 heads x 4 x 8 fp32
    assert by_role["mamba2.ssm"] == 2 * 4 * 4 * 8 * 4
    # replay_x: 2 layers x 2 buffers x 16 hist x 4 x 4 bf16
    assert by_role["mamba2.replay_x"] == 2 * 2 * 16 * 4 * 4 * 2
    assert mgr.sizing.bytes_per_slot == sum(by_role.values())
    assert mgr.sizing.bytes_per_page == 1 * 2 * 4 * 2 * 4 * 2
    assert mgr.device_bytes_needed(9) == mgr.sizing.bytes_for(1, 3)
    assert mgr.sizing.bytes_per_slot + 3 * mgr.sizing.bytes_per_page <= mgr.device_bytes_needed(9)
