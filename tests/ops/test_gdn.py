"""Gated DeltaNet prefill and decode: fast vs naive vs outside oracles (fla, transformers)."""
import pytest
import torch

from hybridcache.ops.gdn import chunk_gated_delta_rule, gdn_decode, gdn_prefill
from hybridcache.ops.gdn.naive import naive_gated_delta_rule, naive_gdn_decode, naive_gdn_prefill
from tests.ops.oracles import fla_naive, hf_qwen3_next


def inputs(B, T, H, HV, K, V, dtype=torch.float32, seed=0):
    """q, k [B, T, H, K]; v [B, T, HV, V]; g (log-decay < 0), beta in (0, 1) [B, T, HV]."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(B, T, HV, generator=gen)) * 0.5
    beta = torch.rand(B, T, HV, generator=gen)
    return [x.to(dtype) for x in (q, k, v)] + [g, beta]


def close(a, b, tol=2e-4):
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4)])
def test_naive_matches_transformers_and_fla(H, HV):
    q, k, v, g, beta = inputs(2, 11, H, HV, 16, 8)
    h0 = torch.randn(2, HV, 16, 8)
    o, s = naive_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                  use_qk_l2norm_in_kernel=True)
    hf = hf_qwen3_next()
    for fn in (hf.torch_recurrent_gated_delta_rule, hf.torch_chunk_gated_delta_rule):
        o_hf, s_hf = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        close(o, o_hf), close(s, s_hf)
    # fla's naive functions take neither grouped heads nor l2norm: expand and normalise here
    r = HV // H
    qn, kn = (torch.nn.functional.normalize(x, dim=-1, eps=0).repeat_interleave(r, 2) for x in (q, k))
    o_ref, s_ref = naive_gated_delta_rule(qn, kn, v, g, beta, initial_state=h0, output_final_state=True)
    fla = fla_naive("gated_delta_rule")
    o_fla, s_fla = fla.naive_recurrent_gated_delta_rule(qn, kn, v, beta=beta, g=g, initial_state=h0,
                                                        output_final_state=True)
    close(o_ref, o_fla), close(s_ref, s_fla)
    o_fla, s_fla = fla.naive_chunk_gated_delta_rule(qn, kn, v, g=g, beta=beta, chunk_size=4, initial_state=h0,
                                                    output_final_state=True)
    close(o_ref, o_fla), close(s_ref, s_fla)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,HV,chunk", [(2, 2, 4), (2, 6, 8), (1, 2, 64)])
def test_chunk_varlen_matches_naive(device, dtype, H, HV, chunk):
    lens = [1, 13, 7, 20]
    N = sum(lens)
    cu = torch.tensor([0] + lens).cumsum(0)
    q, k, v, g, beta = inputs(1, N, H, HV, 16, 8, dtype)
    h0 = torch.randn(len(lens), HV, 16, 8)
    o, s = naive_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                  use_qk_l2norm_in_kernel=True)
    o2, s2 = chunk_gated_delta_rule(*(x.to(device) for x in (q, k, v, g, beta)), initial_state=h0.to(device),
                                    output_final_state=True, cu_seqlens=cu.to(device),
                                    use_qk_l2norm_in_kernel=True, chunk_size=chunk)
    assert o2.dtype == dtype and s2.dtype == torch.float32
    close(o2.cpu(), o, 2e-2 if dtype == torch.bfloat16 else 2e-4)
    close(s2.cpu(), s, 2e-4)


@pytest.mark.parametrize("split", [1, 5, 8, 13])
def test_split_prefill_continues_from_final_state(split):
    q, k, v, g, beta = inputs(2, 21, 2, 4, 16, 8, seed=3)
    whole, s_whole = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                            use_qk_l2norm_in_kernel=True, chunk_size=8)
    a, s_a = chunk_gated_delta_rule(*(x[:, :split] for x in (q, k, v, g, beta)), output_final_state=True,
                                    use_qk_l2norm_in_kernel=True, chunk_size=8)
    b, s_b = chunk_gated_delta_rule(*(x[:, split:] for x in (q, k, v, g, beta)), initial_state=s_a,
                                    output_final_state=True, use_qk_l2norm_in_kernel=True, chunk_size=8)
    close(torch.cat([a, b], 1), whole), close(s_b, s_whole)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pool_prefill_and_decode_match_naive(device, dtype):
    S, HV, K, V = 5, 4, 16, 8
    slots = torch.tensor([3, -1, 0, 2])
    has_initial = torch.tensor([True, True, False, True])
    lens = [6, 4, 9, 1]
    cu = torch.tensor([0] + lens).cumsum(0)
    ssm = torch.randn(S, HV, K, V)
    q, k, v, g, beta = (x[0] for x in inputs(1, sum(lens), 2, HV, K, V, dtype, seed=5))
    ref = ssm.clone()
    o_ref = naive_gdn_prefill(q, k, v, g, beta, cu, ref, slots, has_initial, use_qk_l2norm_in_kernel=True)
    fast = ssm.to(device)
    o = gdn_prefill(*(x.to(device) for x in (q, k, v, g, beta, cu)), fast, slots.to(device),
                    has_initial.to(device), use_qk_l2norm_in_kernel=True, chunk_size=4)
    live = torch.cat([torch.arange(cu[i], cu[i + 1]) for i in range(len(lens)) if slots[i] >= 0])
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-4
    close(o.cpu()[live], o_ref[live], tol), close(fast.cpu(), ref)
    assert torch.equal(fast.cpu()[[1, 4]], ssm[[1, 4]])  # slots no live row owns are untouched

    for T in (1, 3, 8):
        q, k, v, g, beta = inputs(4, T, 2, HV, K, V, dtype, seed=T)
        o_ref = naive_gdn_decode(q, k, v, g, beta, ref, slots, has_initial, use_qk_l2norm_in_kernel=True)
        o = gdn_decode(*(x.to(device) for x in (q, k, v, g, beta)), fast, slots.to(device),
                       has_initial.to(device), use_qk_l2norm_in_kernel=True)
        close(o.cpu()[slots >= 0], o_ref[slots >= 0], tol), close(fast.cpu(), ref)
    assert torch.equal(fast.cpu()[[1, 4]], ssm[[1, 4]])
