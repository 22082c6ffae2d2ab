"""State modules: role sets, the bookkeeping hooks with literal expected values, auxiliary roles."""
import pytest
import torch

from hybridcache.cache import CacheConfig, HybridCacheManager, LayoutError, aux_bytes_per_slot, register_aux_bytes
from hybridcache.cache.sizing import unregister_aux_bytes
from hybridcache.states import AuxState, GDNState, KDAState, KVPages, Mamba2State


def test_replay_accept_hook_folds_flips_appends_and_shifts_the_conv_window():
    state = Mamba2State(1, 1, 1, 1, 1, conv_kernel=4, num_draft_tokens=3, hist=16)  # W = 3, k = 3
    roles = {
        "pnat": torch.tensor([[0, 5, 14, 13, 2]], dtype=torch.int32),
        "buf_idx": torch.tensor([[0, 1, 0, 1, 1]], dtype=torch.int32),
        "conv": torch.arange(5 * 6, dtype=torch.float32).view(1, 5, 1, 6),  # [L, S, C, W + k]
    }
    # HIST 16, T 4: slot 1 (p 5) appends, slot 2 (p 14) folded, slot 3 (p 13 -> 17 > 16) folded
    state.on_accept(roles, torch.tensor([1, 2, 3]), torch.tensor([4, 4, 4], dtype=torch.int32),
                    torch.tensor([2, 3, 1], dtype=torch.int32))
    assert roles["pnat"].tolist() == [[0, 7, 3, 1, 2]]
    assert roles["buf_idx"].tolist() == [[0, 1, 1, 0, 1]]
    # each row holds cat(window, x)[1:]; v valid tokens leave the window [v - 1, v + 2)
    assert roles["conv"][0, :, 0, :3].tolist() == [[0, 1, 2], [7, 8, 9], [14, 15, 16], [18, 19, 20], [24, 25, 26]]


def test_kda_accept_hook_keeps_the_accepted_drafts_pending_and_shifts_the_conv_window():
    state = KDAState(1, 1, 1, conv_kernel=4, num_draft_tokens=3)
    roles = {
        "pend_n": torch.tensor([[2, 2, 2, 2]], dtype=torch.int32),
        "conv": torch.arange(4 * 6, dtype=torch.float32).view(1, 4, 1, 6),
    }
    state.on_accept(roles, torch.tensor([3, 0]), torch.tensor([4, 4], dtype=torch.int32),
                    torch.tensor([1, 4], dtype=torch.int32))
    assert roles["pend_n"].tolist() == [[3, 2, 2, 0]]  # v - 1 accepted drafts stay pending
    assert roles["conv"][0, :, 0, :3].tolist() == [[3, 4, 5], [6, 7, 8], [12, 13, 14], [18, 19, 20]]


def test_role_sets_follow_speculation():
    plain = {r.name for r in Mamba2State(2, 4, 4, 2, 8, 4).roles()}
    spec = {r.name for r in Mamba2State(2, 4, 4, 2, 8, 4, num_draft_tokens=3).roles()}
    assert plain == {"conv", "ssm"}
    assert spec - plain == {"replay_x", "replay_B", "replay_dt", "replay_dA_cumsum", "pnat", "buf_idx"}
    gdn = {r.name: r for r in GDNState(2, 2, 4, 8, 4, 4, num_draft_tokens=3).roles()}
    assert gdn["replay_k"].shape == (2, 16, 2, 8) and gdn["replay_u"].shape == (2, 16, 4, 4)
    assert gdn["conv"].shape == (2 * 2 * 8 + 4 * 4, 3 + 3)
    kda = {r.name: r for r in KDAState(2, 2, 8, 4, num_draft_tokens=3).roles()}
    assert kda["pend_k"].shape == (3, 2, 8) and kda["pend_n"].layers == 1


def test_hist_is_at_least_sixteen_and_at_least_t():
    assert Mamba2State(1, 4, 4, 2, 8, 4, num_draft_tokens=3).hist == 16
    assert Mamba2State(1, 4, 4, 2, 8, 4, num_draft_tokens=20).hist == 21
    assert GDNState(1, 2, 2, 4, 4, 4, num_draft_tokens=3, hist=8).hist == 8


def test_auxiliary_role_moves_with_the_slot_and_is_counted():
    aux = AuxState.single("ple", layers=3, shape=(5,), dtype=torch.float32)
    try:
        assert aux_bytes_per_slot(None)["ple"] == 3 * 5 * 4
        with pytest.raises(LayoutError, match="already registered"):
            register_aux_bytes("ple", lambda _cfg: 1)
        mgr = HybridCacheManager([Mamba2State(1, 4, 4, 2, 8, 4), aux], KVPages(1, 2, 4, 4, torch.float32),
                                 CacheConfig(device_bytes=1 << 16, host_bytes=1 << 16, num_slots=2, page_size=4))
        assert mgr.sizing.bytes_per_slot_by_role["ple.value"] == 60
        mgr.add_request("a")
        mgr.prepare_step(["a"], 3)
        mgr.accept()
        mgr.start_generation("a")
        mgr.state_tensors("ple")["value"][:, mgr.entry("a").slot] = torch.arange(15.0).view(3, 5)
        mgr.suspend(["a"])
        mgr.add_request("b")
        mgr.prepare_step(["b"], 3)  # takes and zeroes a's old slot
        mgr.accept()
        mgr.resume(["a"])
        assert torch.equal(mgr.live_state("a")["ple.value"], torch.arange(15.0).view(3, 5))
        assert not mgr.live_state("b")["ple.value"].any()
    finally:
        unregister_aux_bytes("ple")
