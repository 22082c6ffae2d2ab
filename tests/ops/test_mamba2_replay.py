"""Mamba2 replay verify: fast vs naive, accept rule, replay equivalence, intermediate-state cross-check."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.ops.mamba2 import mamba2_accept, mamba2_decode, mamba2_verify, replay_state
from hybridcache.ops.mamba2.intermediate import mamba2_accept_intermediate, mamba2_verify_intermediate
from hybridcache.ops.mamba2.naive import (
    mamba2_accept_ref,
    mamba2_decode_ref,
    mamba2_verify_ref,
    replay_state_ref,
)

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
ROLE_NAMES = ("ssm", "replay_x", "replay_B", "replay_dt", "replay_dA_cumsum")


def _params(heads: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(A=-torch.exp(torch.rand(heads, generator=g) * 2 - 1), D=torch.randn(heads, generator=g),
                dt_bias=torch.rand(heads, generator=g) - 2.0)


def _tokens(lead, heads, head_dim, groups, dstate, dtype, g):
    return (torch.randn(*lead, heads, head_dim, generator=g).to(dtype),
            torch.randn(*lead, heads, generator=g).to(dtype),
            torch.randn(*lead, groups, dstate, generator=g).to(dtype),
            torch.randn(*lead, groups, dstate, generator=g).to(dtype))


def _roles(slots, heads, head_dim, groups, dstate, hist, dtype, A, g, pnat=None, buf=None) -> dict:
    """Random but self-consistent roles: the cumsum is the running sum of the stored dt * A."""
    dt = torch.rand(slots, 2, heads, hist, generator=g)
    return dict(
        ssm=torch.randn(slots, heads, head_dim, dstate, generator=g),
        replay_x=torch.randn(slots, 2, hist, heads, head_dim, generator=g).to(dtype),
        replay_B=torch.randn(slots, 2, hist, groups, dstate, generator=g).to(dtype),
        replay_dt=dt,
        replay_dA_cumsum=torch.cumsum(dt * A[:, None], dim=-1),
        pnat=torch.zeros(slots, dtype=torch.int32) if pnat is None else torch.tensor(pnat, dtype=torch.int32),
        buf_idx=torch.zeros(slots, dtype=torch.int32) if buf is None else torch.tensor(buf, dtype=torch.int32),
    )


def _clone(roles: dict) -> dict:
    return {k: v.clone() for k, v in roles.items()}


def _to(tensors: dict, device: str) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in tensors.items()}


def _verify(fn, inputs, roles, slots, kw):
    x, dt, B, C = inputs
    return fn(x, dt, kw["A"], B, C, *(roles[n] for n in ROLE_NAMES), roles["pnat"], roles["buf_idx"], slots,
              D=kw["D"], dt_bias=kw["dt_bias"], dt_limit=kw.get("dt_limit", (0.0, float("inf"))))


SHAPES = [(4, 8, 1, 16), (6, 4, 3, 8)]  # heads, head_dim, groups, dstate


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("steps", [1, 2, 4, 8])
def test_verify_fast_matches_naive(dtype, shape, steps, device):
    heads, head_dim, groups, dstate = shape
    hist = 8
    g = torch.Generator().manual_seed(steps)
    kw = _params(heads) | dict(dt_limit=(0.0, 3.0))
    # slots 0..6; pnat spans append-only, exact fit and fold; buffers mixed; slot 6 is in no row
    pnat = [0, hist - steps, hist - steps + 1, hist, 3, 1, 2]
    roles = _roles(7, heads, head_dim, groups, dstate, hist, dtype, kw["A"], g, pnat, [0, 1, 1, 0, 1, 0, 1])
    slots = torch.tensor([3, 0, -1, 2, 1, 5, 4])
    inputs = _tokens((7, steps), heads, head_dim, groups, dstate, dtype, g)
    ref = _clone(roles)
    untouched = _clone(roles)
    on = _to(roles, device)
    y = _verify(mamba2_verify, [t.to(device) for t in inputs], on, slots.to(device), _to(kw, device)).cpu()
    roles = _to(on, "cpu")
    y_ref = _verify(mamba2_verify_ref, inputs, ref, slots, kw)
    assert y.dtype == dtype
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    for name in ROLE_NAMES:
        torch.testing.assert_close(roles[name], ref[name], atol=1e-4, rtol=1e-4, msg=name)
        assert torch.equal(roles[name][6], untouched[name][6]), name
    assert torch.equal(roles["pnat"], untouched["pnat"]) and torch.equal(roles["buf_idx"], untouched["buf_idx"])


@settings(max_examples=30, deadline=None)
@given(steps=st.integers(1, 8), pnat=st.lists(st.integers(0, 8), min_size=4, max_size=4),
       buf=st.lists(st.integers(0, 1), min_size=4, max_size=4), pad=st.integers(0, 4), seed=st.integers(0, 999))
def test_verify_fast_matches_naive_any_bookkeeping(steps, pnat, buf, pad, seed):
    heads, head_dim, groups, dstate, hist = 4, 4, 2, 4, 8
    g = torch.Generator().manual_seed(seed)
    kw = _params(heads, seed)
    roles = _roles(4, heads, head_dim, groups, dstate, hist, torch.float32, kw["A"], g, pnat, buf)
    slots = torch.randperm(4, generator=g)
    slots[pad:pad + 1] = -1  # pad == 4: no padding row
    inputs = _tokens((4, steps), heads, head_dim, groups, dstate, torch.float32, g)
    ref = _clone(roles)
    y = _verify(mamba2_verify, inputs, roles, slots, kw)
    y_ref = _verify(mamba2_verify_ref, inputs, ref, slots, kw)
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    for name in ROLE_NAMES:
        torch.testing.assert_close(roles[name], ref[name], atol=1e-4, rtol=1e-4, msg=name)


def test_accept_matches_rule():
    pnat = torch.tensor([0, 5, 6, 8, 3, 7], dtype=torch.int32)
    buf = torch.tensor([0, 1, 0, 1, 1, 0], dtype=torch.int32)
    slots = torch.tensor([0, 1, -1, 2, 3, 5])
    valid = torch.tensor([4, 1, 2, 3, 2, 4])
    p_ref, b_ref = pnat.clone(), buf.clone()
    mamba2_accept(pnat, buf, slots, 4, valid, hist=8)
    mamba2_accept_ref(p_ref, b_ref, slots, 4, valid, hist=8)
    assert pnat.tolist() == p_ref.tolist() == [4, 1, 3, 2, 3, 4]  # slot 4 is in no row
    assert buf.tolist() == b_ref.tolist() == [0, 0, 1, 0, 1, 1]


@pytest.mark.parametrize("impl", ["fast", "naive"])
@pytest.mark.parametrize("drafts", [1, 3])
def test_replay_equals_sequential_accepted_tokens(impl, drafts):
    """Many verify steps with random accept counts (folds and flips included) against a plain
    recurrence fed only the accepted tokens; also checks the effective state every step."""
    verify, accept, state_of = ((mamba2_verify, mamba2_accept, replay_state) if impl == "fast"
                                else (mamba2_verify_ref, mamba2_accept_ref, replay_state_ref))
    heads, head_dim, groups, dstate, hist, steps = 4, 4, 2, 8, 6, drafts + 1
    g = torch.Generator().manual_seed(drafts)
    kw = _params(heads, drafts)
    roles = _roles(4, heads, head_dim, groups, dstate, hist, torch.float32, kw["A"], g)
    roles["pnat"].zero_()
    slots = torch.tensor([2, -1, 0, 3])
    plain = roles["ssm"].clone()  # the plain recurrence's own pool, same starting checkpoints
    folds = flips = 0
    for _ in range(16):
        inputs = _tokens((4, steps), heads, head_dim, groups, dstate, torch.float32, g)
        num_valid = torch.randint(1, steps + 1, (4,), generator=g)
        folds += int(((roles["pnat"][slots.clamp_min(0)] + steps > hist) & (slots >= 0)).sum())
        before_buf = roles["buf_idx"].clone()
        y = _verify(verify, inputs, roles, slots, kw)
        accept(roles["pnat"], roles["buf_idx"], slots, steps, num_valid, hist=hist)
        flips += int((before_buf != roles["buf_idx"]).sum())
        x, dt, B, C = inputs
        for t in range(steps):
            live = torch.where(t < num_valid, slots, -1)  # feed token t only to rows that accepted it
            y_plain = mamba2_decode_ref(x[:, t], dt[:, t], kw["A"], B[:, t], C[:, t], plain, live, kw["D"], kw["dt_bias"])
            rows = (live >= 0).nonzero()[:, 0]
            torch.testing.assert_close(y[rows, t], y_plain[rows], atol=1e-4, rtol=1e-4)
        state = state_of(*(roles[n] for n in ROLE_NAMES), roles["pnat"], roles["buf_idx"], slots)
        torch.testing.assert_close(state[[0, 2, 3]], plain[[2, 0, 3]], atol=1e-4, rtol=1e-4)
    assert folds > 0 and flips > 0
    assert torch.equal(roles["ssm"][1], plain[1])  # slot 1 belongs to no row


@pytest.mark.parametrize("steps", [1, 4])
def test_intermediate_states_agree_with_replay(steps):
    heads, head_dim, groups, dstate, hist = 4, 4, 2, 8, 8
    g = torch.Generator().manual_seed(5)
    kw = _params(heads)
    roles = _roles(3, heads, head_dim, groups, dstate, hist, torch.float32, kw["A"], g, [0, 0, 0], [0, 1, 0])
    inter = torch.zeros(3, steps, heads, head_dim, dstate)
    ckpt = roles["ssm"].clone()
    slots = torch.tensor([1, -1, 0])
    inputs = _tokens((3, steps), heads, head_dim, groups, dstate, torch.float32, g)
    x, dt, B, C = inputs
    y_int = mamba2_verify_intermediate(x, dt, kw["A"], B, C, ckpt, inter, slots, kw["D"], kw["dt_bias"])
    y = _verify(mamba2_verify, inputs, roles, slots, kw)
    torch.testing.assert_close(y_int[[0, 2]], y[[0, 2]], atol=1e-4, rtol=1e-4)
    num_valid = torch.tensor([steps, 1, max(1, steps - 1)])
    mamba2_accept_intermediate(ckpt, inter, slots, num_valid)
    mamba2_accept(roles["pnat"], roles["buf_idx"], slots, steps, num_valid, hist=hist)
    state = replay_state(*(roles[n] for n in ROLE_NAMES), roles["pnat"], roles["buf_idx"], slots)
    torch.testing.assert_close(ckpt[[1, 0]], state[[0, 2]], atol=1e-4, rtol=1e-4)
    assert torch.equal(inter[2], torch.zeros_like(inter[2]))


def test_decode_is_verify_of_one_token_without_history():
    heads, head_dim, groups, dstate = 6, 4, 3, 8
    g = torch.Generator().manual_seed(9)
    kw = _params(heads)
    roles = _roles(2, heads, head_dim, groups, dstate, 4, torch.float32, kw["A"], g)
    ssm = roles["ssm"].clone()
    inputs = _tokens((2, 1), heads, head_dim, groups, dstate, torch.float32, g)
    x, dt, B, C = inputs
    slots = torch.tensor([1, 0])
    y = _verify(mamba2_verify, inputs, roles, slots, kw)
    y_dec = mamba2_decode(x[:, 0], dt[:, 0], kw["A"], B[:, 0], C[:, 0], ssm, slots, kw["D"], kw["dt_bias"])
    torch.testing.assert_close(y[:, 0], y_dec, atol=1e-5, rtol=1e-5)


def test_verify_decode_accept_make_no_host_sync_call():
    """The CPU tripwire (tests/ops/tripwire.py): what would synchronise on a GPU raises here."""
    from tests.ops.tripwire import no_host_sync

    heads, head_dim, groups, dstate, hist, steps = 4, 4, 2, 4, 8, 4
    g = torch.Generator().manual_seed(5)
    kw = _params(heads)
    roles = _roles(4, heads, head_dim, groups, dstate, hist, torch.float32, kw["A"], g, [0, 6, 3, 8], [0, 1, 1, 0])
    slots = torch.tensor([2, -1, 0, 3])
    inputs = _tokens((4, steps), heads, head_dim, groups, dstate, torch.float32, g)
    x, dt, B, C = _tokens((4,), heads, head_dim, groups, dstate, torch.float32, g)
    with no_host_sync():
        _verify(mamba2_verify, inputs, roles, slots, kw)
        mamba2_accept(roles["pnat"], roles["buf_idx"], slots, steps, torch.tensor([1, 1, 4, 2]), hist=hist)
        mamba2_decode(x, dt, kw["A"], B, C, roles["ssm"], slots, kw["D"], kw["dt_bias"])
