"""KDA prefill, decode and gate: fast vs naive vs outside oracles (fla, transformers)."""
from types import SimpleNamespace

import pytest
import torch

from hybridcache.ops.kda import chunk_kda, kda_decode, kda_gate, kda_prefill
from hybridcache.ops.kda.naive import naive_kda, naive_kda_decode, naive_kda_prefill
from tests.ops.oracles import fla_naive, hf_kimi_linear


def inputs(B, T, H, K, V, dtype=torch.float32, seed=0):
    """q, k, g [B, T, H, K] (g per-channel log-decay < 0); v [B, T, H, V]; beta [B, T, H]."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(B, T, H, K, generator=gen)) * 0.5
    beta = torch.rand(B, T, H, generator=gen)
    return [x.to(dtype) for x in (q, k, v)] + [g, beta]


def close(a, b, tol=2e-4):
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def test_naive_matches_transformers_and_fla():
    q, k, v, g, beta = inputs(2, 16, 3, 16, 8)
    h0 = torch.randn(2, 3, 16, 8)
    o, s = naive_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    hf = hf_kimi_linear()
    o_hf, s_hf = hf.recurrent_kimi_delta_attention(q, k, v, g, beta, h0, True, use_qk_l2norm_in_kernel=True)
    close(o, o_hf), close(s, s_hf)
    o_hf, s_hf = hf.chunk_kimi_delta_attention(q, k, v, g, beta, chunk_size=8, initial_state=h0,
                                               output_final_state=True, use_qk_l2norm_in_kernel=True)
    close(o, o_hf), close(s, s_hf)
    o, s = naive_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    fla = fla_naive("kda")
    o_fla, s_fla = fla.naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    close(o, o_fla), close(s, s_fla)
    o_fla, s_fla = fla.naive_chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=8)
    close(o, o_fla), close(s, s_fla)


def test_gate_matches_transformers():
    H, K, hidden = 3, 8, 16
    cfg = SimpleNamespace(linear_head_dim=K, linear_num_heads=H, hidden_size=hidden)
    gate = hf_kimi_linear().KimiLinearForgetGate(cfg)
    with torch.no_grad():
        for prm in gate.parameters():
            prm.copy_(torch.randn(prm.shape) * 3)
        x = torch.randn(2, 5, hidden)
        raw = gate.f_b_proj(gate.f_a_proj(x)).view(2, 5, H, K)
        assert (raw + gate.dt_bias.view(H, K) > 20).any()  # the softplus cut-off is exercised
        torch.testing.assert_close(kda_gate(raw, gate.A_log, gate.dt_bias), gate(x), rtol=0, atol=0)
        lower = kda_gate(raw, gate.A_log, gate.dt_bias, lower_bound=-5.0)
        expected = -5.0 / (1 + torch.exp(-gate.A_log.view(H, 1).exp() * (raw + gate.dt_bias.view(H, K))))
        close(lower, expected, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [4, 16])
def test_chunk_varlen_matches_naive(device, dtype, chunk):
    lens = [1, 13, 7, 20]
    cu = torch.tensor([0] + lens).cumsum(0)
    q, k, v, g, beta = inputs(1, sum(lens), 2, 16, 8, dtype)
    h0 = torch.randn(len(lens), 2, 16, 8)
    o, s = naive_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                     use_qk_l2norm_in_kernel=True)
    o2, s2 = chunk_kda(*(x.to(device) for x in (q, k, v, g, beta)), initial_state=h0.to(device),
                       output_final_state=True, cu_seqlens=cu.to(device), use_qk_l2norm_in_kernel=True,
                       chunk_size=chunk)
    assert o2.dtype == dtype and s2.dtype == torch.float32
    close(o2.cpu(), o, 2e-2 if dtype == torch.bfloat16 else 2e-4), close(s2.cpu(), s)


@pytest.mark.parametrize("split", [1, 6, 11])
def test_split_prefill_continues_from_final_state(split):
    q, k, v, g, beta = inputs(2, 19, 2, 16, 8, seed=3)
    whole, s_whole = chunk_kda(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True,
                               chunk_size=8)
    a, s_a = chunk_kda(*(x[:, :split] for x in (q, k, v, g, beta)), output_final_state=True,
                       use_qk_l2norm_in_kernel=True, chunk_size=8)
    b, s_b = chunk_kda(*(x[:, split:] for x in (q, k, v, g, beta)), initial_state=s_a, output_final_state=True,
                       use_qk_l2norm_in_kernel=True, chunk_size=8)
    close(torch.cat([a, b], 1), whole), close(s_b, s_whole)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pool_prefill_and_decode_match_naive(device, dtype):
    S, H, K, V = 5, 2, 16, 8
    slots = torch.tensor([3, -1, 0, 2])
    has_initial = torch.tensor([True, True, False, True])
    lens = [6, 4, 9, 1]
    cu = torch.tensor([0] + lens).cumsum(0)
    ssm = torch.randn(S, H, K, V)
    q, k, v, g, beta = (x[0] for x in inputs(1, sum(lens), H, K, V, dtype, seed=5))
    ref = ssm.clone()
    o_ref = naive_kda_prefill(q, k, v, g, beta, cu, ref, slots, has_initial, use_qk_l2norm_in_kernel=True)
    fast = ssm.to(device)
    o = kda_prefill(*(x.to(device) for x in (q, k, v, g, beta, cu)), fast, slots.to(device),
                    has_initial.to(device), use_qk_l2norm_in_kernel=True, chunk_size=4)
    live = torch.cat([torch.arange(cu[i], cu[i + 1]) for i in range(len(lens)) if slots[i] >= 0])
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-4
    close(o.cpu()[live], o_ref[live], tol), close(fast.cpu(), ref)
    assert torch.equal(fast.cpu()[[1, 4]], ssm[[1, 4]])

    for T in (1, 3, 8):
        q, k, v, g, beta = inputs(4, T, H, K, V, dtype, seed=T)
        o_ref = naive_kda_decode(q, k, v, g, beta, ref, slots, has_initial, use_qk_l2norm_in_kernel=True)
        o = kda_decode(*(x.to(device) for x in (q, k, v, g, beta)), fast, slots.to(device), has_initial.to(device),
                       use_qk_l2norm_in_kernel=True)
        close(o.cpu()[slots >= 0], o_ref[slots >= 0], tol), close(fast.cpu(), ref)
    assert torch.equal(fast.cpu()[[1, 4]], ssm[[1, 4]])
