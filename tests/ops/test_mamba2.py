"""Mamba2 prefill (chunked scan) and decode: fast vs naive, padding, split prefill, transformers oracle."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.ops.mamba2 import mamba2_chunk_scan_varlen, mamba2_decode, mamba2_prefill
from hybridcache.ops.mamba2.naive import mamba2_decode_ref, mamba2_prefill_ref

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
STATE_TOL = dict(atol=1e-4, rtol=1e-4)


def _params(heads: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        A=-torch.exp(torch.rand(heads, generator=g) * 2 - 1),
        D=torch.randn(heads, generator=g),
        dt_bias=torch.rand(heads, generator=g) - 2.0,
    )


def _tokens(lead: tuple[int, ...], heads, head_dim, groups, dstate, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, heads, head_dim, generator=g).to(dtype)
    dt = torch.randn(*lead, heads, generator=g).to(dtype)
    B = torch.randn(*lead, groups, dstate, generator=g).to(dtype)
    C = torch.randn(*lead, groups, dstate, generator=g).to(dtype)
    return x, dt, B, C


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + lens).cumsum(0)


SHAPES = [(4, 8, 1, 16), (6, 4, 3, 8), (8, 8, 8, 4)]  # heads, head_dim, groups, dstate


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunk", [4, 16])
def test_prefill_fast_matches_naive(dtype, shape, chunk, device):
    heads, head_dim, groups, dstate = shape
    lens = [11, 0, 3, 17, 5]
    slots = torch.tensor([2, 5, -1, 0, 3])
    has_initial = torch.tensor([True, True, True, False, True])
    x, dt, B, C = _tokens((sum(lens),), heads, head_dim, groups, dstate, dtype)
    ssm = torch.randn(6, heads, head_dim, dstate)
    ssm_ref = ssm.clone()
    kw = _params(heads) | dict(dt_limit=(0.0, 2.0))
    d = {k: v.to(device) for k, v in kw.items() if torch.is_tensor(v)}
    ssm = ssm.to(device)
    y = mamba2_prefill(x.to(device), dt.to(device), d["A"], B.to(device), C.to(device), ssm, slots.to(device),
                       has_initial.to(device), _cu(lens).to(device), D=d["D"], dt_bias=d["dt_bias"],
                       dt_limit=kw["dt_limit"], chunk_size=chunk).cpu()
    ssm = ssm.cpu()
    y_ref = mamba2_prefill_ref(x, dt, kw["A"], B, C, ssm_ref, slots, has_initial, _cu(lens), D=kw["D"],
                               dt_bias=kw["dt_bias"], dt_limit=kw["dt_limit"])
    assert y.dtype == dtype
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    # on CUDA a bf16 prefill runs fla's simple-GLA chunk kernel, which keeps per-chunk states in bf16
    fla_bf16 = device == "cuda" and dtype == torch.bfloat16
    torch.testing.assert_close(ssm, ssm_ref, **(TOL[dtype] if fla_bf16 else STATE_TOL))
    assert torch.equal(ssm[[1, 4]], ssm_ref[[1, 4]])  # untouched slots stay bit for bit


@settings(max_examples=20, deadline=None)
@given(length=st.integers(2, 40), split=st.integers(1, 39), chunk=st.sampled_from([4, 8, 16]), seed=st.integers(0, 999))
def test_split_prefill_equals_unsplit(length, split, chunk, seed):
    split = min(split, length - 1)
    heads, head_dim, groups, dstate = 4, 4, 2, 8
    x, dt, B, C = _tokens((length,), heads, head_dim, groups, dstate, torch.float32, seed)
    kw = _params(heads, seed)
    ssm = torch.zeros(2, heads, head_dim, dstate)
    slot, fresh, cont = torch.tensor([1]), torch.tensor([False]), torch.tensor([True])
    y_full = mamba2_prefill(x, dt, kw["A"], B, C, ssm, slot, fresh, _cu([length]), kw["D"], kw["dt_bias"], chunk_size=chunk)
    full_state = ssm[1].clone()
    y_a = mamba2_prefill(x[:split], dt[:split], kw["A"], B[:split], C[:split], ssm, slot, fresh, _cu([split]),
                         kw["D"], kw["dt_bias"], chunk_size=chunk)
    y_b = mamba2_prefill(x[split:], dt[split:], kw["A"], B[split:], C[split:], ssm, slot, cont,
                         _cu([length - split]), kw["D"], kw["dt_bias"], chunk_size=chunk)
    torch.testing.assert_close(torch.cat([y_a, y_b]), y_full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ssm[1], full_state, atol=1e-4, rtol=1e-4)


def test_prefill_then_decode_equals_prefill():
    heads, head_dim, groups, dstate = 4, 4, 2, 8
    x, dt, B, C = _tokens((9,), heads, head_dim, groups, dstate, torch.float32)
    kw = _params(heads)
    ssm = torch.zeros(1, heads, head_dim, dstate)
    y_full = mamba2_prefill(x, dt, kw["A"], B, C, ssm.clone(), torch.tensor([0]), torch.tensor([False]), _cu([9]),
                            kw["D"], kw["dt_bias"], chunk_size=4)
    ys = [mamba2_prefill(x[:5], dt[:5], kw["A"], B[:5], C[:5], ssm, torch.tensor([0]), torch.tensor([False]),
                         _cu([5]), kw["D"], kw["dt_bias"], chunk_size=4)]
    for t in range(5, 9):
        ys.append(mamba2_decode(x[t : t + 1], dt[t : t + 1], kw["A"], B[t : t + 1], C[t : t + 1], ssm,
                                torch.tensor([0]), kw["D"], kw["dt_bias"]))
    torch.testing.assert_close(torch.cat(ys), y_full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_decode_fast_matches_naive(dtype, shape, device):
    heads, head_dim, groups, dstate = shape
    slots = torch.tensor([3, -1, 0, 1])
    x, dt, B, C = _tokens((4,), heads, head_dim, groups, dstate, dtype)
    ssm = torch.randn(5, heads, head_dim, dstate)
    ssm_ref = ssm.clone()
    kw = _params(heads)
    d = {k: v.to(device) for k, v in kw.items()}
    ssm = ssm.to(device)
    y = mamba2_decode(x.to(device), dt.to(device), d["A"], B.to(device), C.to(device), ssm, slots.to(device), d["D"],
                      d["dt_bias"], (0.1, 1.0)).cpu()
    ssm = ssm.cpu()
    y_ref = mamba2_decode_ref(x, dt, kw["A"], B, C, ssm_ref, slots, kw["D"], kw["dt_bias"], (0.1, 1.0))
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    torch.testing.assert_close(ssm, ssm_ref, **STATE_TOL)
    assert torch.equal(ssm[[2, 4]], ssm_ref[[2, 4]])


def test_all_padding_writes_nothing():
    heads, head_dim, groups, dstate = 4, 4, 2, 8
    ssm = torch.randn(3, heads, head_dim, dstate)
    before = ssm.clone()
    kw = _params(heads)
    x, dt, B, C = _tokens((2,), heads, head_dim, groups, dstate, torch.float32)
    mamba2_decode(x, dt, kw["A"], B, C, ssm, torch.tensor([-1, -1]), kw["D"], kw["dt_bias"])
    assert torch.equal(ssm, before)


@pytest.mark.parametrize("groups", [1, 2])
def test_chunk_scan_against_transformers(groups):
    nh = pytest.importorskip("transformers.models.nemotron_h.modeling_nemotron_h")
    heads, head_dim, dstate, length = 4, 8, 16, 23
    x, dt, B, C = _tokens((length,), heads, head_dim, groups, dstate, torch.float32)
    kw = _params(heads)
    init = torch.randn(1, heads, head_dim, dstate)
    y, final = mamba2_chunk_scan_varlen(x, dt, kw["A"], B, C, _cu([length]), init, kw["D"], kw["dt_bias"],
                                        (0.0, 1.5), chunk_size=8)
    y_hf, final_hf = nh.mamba2_chunk_scan(x[None], dt[None], kw["A"], B[None], C[None], chunk_size=8, D=kw["D"],
                                          dt_bias=kw["dt_bias"], initial_states=init, dt_softplus=True,
                                          dt_limit=(0.0, 1.5), return_final_states=True)
    torch.testing.assert_close(y, y_hf[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, final_hf, atol=1e-4, rtol=1e-4)


def test_decode_against_transformers():
    nh = pytest.importorskip("transformers.models.nemotron_h.modeling_nemotron_h")
    heads, head_dim, groups, dstate = 6, 4, 3, 8
    x, dt, B, C = _tokens((3,), heads, head_dim, groups, dstate, torch.float32)
    kw = _params(heads)
    ssm = torch.randn(3, heads, head_dim, dstate)
    state_hf = ssm[[2, 0, 1]].clone()
    y = mamba2_decode(x, dt, kw["A"], B, C, ssm, torch.tensor([2, 0, 1]), kw["D"], kw["dt_bias"])
    # transformers' decode takes dt, dt_bias, D and A expanded over head_dim (as its mixer calls it)
    expand = dict(A=kw["A"][:, None, None].expand(heads, head_dim, dstate), D=kw["D"][:, None].expand(heads, head_dim),
                  dt_bias=kw["dt_bias"][:, None].expand(heads, head_dim))
    y_hf = nh.mamba2_selective_state_update(state_hf, x, dt[..., None].expand(3, heads, head_dim), expand["A"], B, C,
                                            D=expand["D"], dt_bias=expand["dt_bias"], dt_softplus=True)
    torch.testing.assert_close(y, y_hf, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ssm[[2, 0, 1]], state_hf, atol=1e-5, rtol=1e-5)
