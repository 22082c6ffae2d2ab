"""Causal depthwise conv1d: fast vs naive, padding rows, split prefill, transformers as an oracle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.ops.conv1d import causal_conv1d_prefill, causal_conv1d_update, shift_conv_window
from hybridcache.ops.conv1d.naive import causal_conv1d_prefill_ref, causal_conv1d_update_ref

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _setup(slots_total: int, channels: int, width: int, extra: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(channels, width, generator=g)
    bias = torch.randn(channels, generator=g)
    conv = torch.randn(slots_total, channels, width - 1 + extra, generator=g).to(dtype)
    return weight, bias, conv


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + lens).cumsum(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_prefill_fast_matches_naive(dtype, width, activation, device):
    weight, bias, conv = _setup(6, 5, width, 3, dtype)
    lens = [7, 0, 1, 12, 2]
    slots = torch.tensor([4, 1, -1, 0, 5])
    has_initial = torch.tensor([True, True, True, False, True])
    x = torch.randn(sum(lens), 5).to(dtype)
    conv_ref = conv.clone()
    conv = conv.to(device)
    dev = [t.to(device) for t in (x, weight, bias, slots, has_initial, _cu(lens))]
    y = causal_conv1d_prefill(dev[0], dev[1], dev[2], conv, *dev[3:], activation).cpu()
    conv = conv.cpu()
    y_ref = causal_conv1d_prefill_ref(x, weight, bias, conv_ref, slots, has_initial, _cu(lens), activation)
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    torch.testing.assert_close(conv, conv_ref, **TOL[dtype])
    torch.testing.assert_close(conv[[2, 3]], _setup(6, 5, width, 3, dtype)[2][[2, 3]], atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("steps", [1, 2, 4, 8])
def test_update_fast_matches_naive(dtype, steps, device):
    weight, bias, conv = _setup(5, 6, 4, 7, dtype, seed=steps)
    slots = torch.tensor([3, -1, 0, 4])
    x = torch.randn(4, steps, 6).to(dtype)
    untouched = conv[[1, 2]].clone()
    window = conv[3, :, :3].clone()
    conv_ref = conv.clone()
    conv = conv.to(device)
    y = causal_conv1d_update(x.to(device), weight.to(device), bias.to(device), conv, slots.to(device), "silu").cpu()
    conv = conv.cpu()
    y_ref = causal_conv1d_update_ref(x, weight, bias, conv_ref, slots, "silu")
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    torch.testing.assert_close(conv, conv_ref, atol=0, rtol=0)
    torch.testing.assert_close(conv[[1, 2]], untouched, atol=0, rtol=0)
    expected = torch.cat([window, x[0].T], dim=1)[:, 1:]  # layouts.md: cat(window, x)[..., 1:]
    torch.testing.assert_close(conv[3, :, : 3 + steps - 1], expected, atol=0, rtol=0)


def test_update_all_padding_writes_nothing():
    weight, bias, conv = _setup(3, 4, 4, 3, torch.float32)
    before = conv.clone()
    causal_conv1d_update(torch.randn(2, 4, 4), weight, bias, conv, torch.tensor([-1, -1]))
    torch.testing.assert_close(conv, before, atol=0, rtol=0)


@settings(max_examples=25, deadline=None)
@given(length=st.integers(1, 20), split=st.integers(0, 20), width=st.integers(2, 5), seed=st.integers(0, 99))
def test_split_prefill_then_decode_equals_one_prefill(length, split, width, seed):
    split = min(split, length)
    weight, bias, conv = _setup(2, 3, width, 1, torch.float32, seed)
    x = torch.randn(length, 3, generator=torch.Generator().manual_seed(seed))
    one = conv.clone()
    y_full = causal_conv1d_prefill(x, weight, bias, one, torch.tensor([1]), torch.tensor([False]), _cu([length]))
    two = conv.clone()
    y_a = causal_conv1d_prefill(x[:split], weight, bias, two, torch.tensor([1]), torch.tensor([False]), _cu([split]))
    rest = x[split:]
    if rest.shape[0] > 1:
        y_b = causal_conv1d_prefill(rest[:-1], weight, bias, two, torch.tensor([1]), torch.tensor([True]), _cu([rest.shape[0] - 1]))
    else:
        y_b = rest[:0]
    y_c = causal_conv1d_update(rest[-1:][None], weight, bias, two, torch.tensor([1]))[0] if rest.shape[0] else rest[:0]
    torch.testing.assert_close(torch.cat([y_a, y_b, y_c]), y_full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(two[1, :, : width - 1], one[1, :, : width - 1], atol=0, rtol=0)


def test_against_transformers():
    nh = pytest.importorskip("transformers.models.nemotron_h.modeling_nemotron_h")
    weight, bias, conv = _setup(3, 6, 4, 3, torch.float32)
    x = torch.randn(9, 6)
    y = causal_conv1d_prefill(x, weight, bias, conv, torch.tensor([2]), torch.tensor([False]), _cu([9]), "silu")
    y_hf = nh.causal_conv1d_fn(x.T[None], weight, bias, activation="silu")[0].T
    torch.testing.assert_close(y, y_hf, atol=1e-5, rtol=1e-5)
    state = conv[2:3, :, :3].clone()
    xs = torch.randn(1, 1, 6)
    y_upd = causal_conv1d_update(xs, weight, bias, conv, torch.tensor([2]), "silu")
    y_upd_hf = nh.causal_conv1d_update(xs.transpose(1, 2), state, weight, bias, activation="silu")
    torch.testing.assert_close(y_upd[0, 0], y_upd_hf[0, :, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(conv[2, :, :3], state[0], atol=0, rtol=0)


def test_update_makes_no_host_sync_call():
    """The CPU tripwire (tests/ops/tripwire.py): what would synchronise on a GPU raises here."""
    from tests.ops.tripwire import no_host_sync

    g = torch.Generator().manual_seed(0)
    conv = torch.randn(4, 6, 3 + 3, generator=g)
    x, weight, bias = torch.randn(3, 4, 6, generator=g), torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
    with no_host_sync():
        causal_conv1d_update(x, weight, bias, conv, torch.tensor([2, -1, 0]), activation="silu")


def test_accept_keeps_the_window_the_valid_tokens_leave():
    # W = 3, k = 3: after verify the row holds cat(window, x)[1:] = [w1 w2 x0 x1 x2 x3]
    conv = torch.arange(2 * 6, dtype=torch.float32).view(1, 2, 1, 6)  # [L, S, C, W + k]
    shift_conv_window(conv, torch.tensor([0, 1]), torch.tensor([1, 4]), width=3)
    assert conv[0, 0, 0, :3].tolist() == [0.0, 1.0, 2.0]  # v = 1: the window ends at x0
    assert conv[0, 1, 0, :3].tolist() == [9.0, 10.0, 11.0]  # v = 4: the window ends at x3


def test_a_one_token_step_keeps_the_window_without_a_shift(monkeypatch):
    """T = 1 (a speculative step whose rows all back off): every row keeps v = 1, so the accept rule is the
    identity; given num_tokens=1 it returns before any work (a shift that ran would raise here), and the
    window is what the full rule leaves."""
    import hybridcache.ops.conv1d.fast as fast

    conv = torch.randn(2, 3, 4, 3 + 1, generator=torch.Generator().manual_seed(0))  # [L, S, C, W + T] with T = 1
    slots, valid = torch.tensor([2, 0]), torch.ones(2, dtype=torch.int32)
    full = conv.clone()
    shift_conv_window(full, slots, valid, width=3)
    monkeypatch.setattr(fast, "runs_triton", lambda t: (_ for _ in ()).throw(AssertionError("shifted")))
    kept = conv.clone()
    fast.shift_conv_window(kept, slots, valid, 3, num_tokens=1)
    assert torch.equal(kept, conv) and torch.equal(kept, full)
    with pytest.raises(AssertionError, match="shifted"):
        fast.shift_conv_window(kept, slots, valid, 3, num_tokens=2)
