"""KDA prefill, decode and gate: fast vs naive vs outside oracles (fla, transformers)."""
from types import SimpleNamespace

import pytest
import torch

from hybridcache.ops.kda import chunk_kda, kda_decode, kda_gate, kda_prefill
from hybridcache.ops.kda.naive import naive_kda, naive_kda_decode, naive_kda_prefill
from tests.ops.delta_rule_cases import (
    check_chunk_varlen,
    check_pool_prefill_and_decode,
    check_split_prefill,
    close,
    delta_inputs,
)
from tests.ops.oracles import fla_naive, hf_kimi_linear


def inputs(B, T, H, K, V, dtype=torch.float32, seed=0):
    """q, k, g [B, T, H, K] (g per-channel log-decay < 0); v [B, T, H, V]; beta [B, T, H]."""
    return delta_inputs(B, T, H, H, K, V, (H, K), dtype, seed)


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
    x = inputs(1, sum(lens), 2, 16, 8, dtype)
    h0 = torch.randn(len(lens), 2, 16, 8)
    check_chunk_varlen(chunk_kda, naive_kda, x, h0, cu, device, dtype, chunk)


@pytest.mark.parametrize("split", [1, 6, 11])
def test_split_prefill_continues_from_final_state(split):
    check_split_prefill(chunk_kda, inputs(2, 19, 2, 16, 8, seed=3), split)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pool_prefill_and_decode_match_naive(device, dtype):
    H, K, V = 2, 16, 8
    check_pool_prefill_and_decode(kda_prefill, naive_kda_prefill, kda_decode, naive_kda_decode,
                                  lambda B, T, dt, seed: inputs(B, T, H, K, V, dt, seed=seed), (H, K, V),
                                  device, dtype)
