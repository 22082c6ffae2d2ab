"""Gated DeltaNet prefill and decode: fast vs naive vs outside oracles (fla, transformers)."""
import pytest
import torch

from hybridcache.ops.gdn import chunk_gated_delta_rule, gdn_decode, gdn_prefill
from hybridcache.ops.gdn.naive import naive_gated_delta_rule, naive_gdn_decode, naive_gdn_prefill
from tests.ops.delta_rule_cases import (
    check_chunk_varlen,
    check_pool_prefill_and_decode,
    check_split_prefill,
    close,
    delta_inputs,
)
from tests.ops.oracles import fla_naive, hf_qwen3_next


def inputs(B, T, H, HV, K, V, dtype=torch.float32, seed=0):
    """q, k [B, T, H, K]; v [B, T, HV, V]; g (log-decay < 0, one per value head), beta in (0, 1) [B, T, HV]."""
    return delta_inputs(B, T, H, HV, K, V, (HV,), dtype, seed)


@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4)])
def test_naive_matches_transformers_and_fla(H, HV):
    q, k, v, g, beta = inputs(2, 11, H, HV, 16, 8)
    h0 = torch.randn(2, HV, 16, 8)
    o, s = naive_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                  use_qk_l2norm_in_kernel=True)
    hf = hf_qwen3_next()
    r = HV // H
    qe, ke = (x.repeat_interleave(r, 2) for x in (q, k))  # transformers 5.17 takes no grouped heads
    for fn in (hf.torch_recurrent_gated_delta_rule, hf.torch_chunk_gated_delta_rule):
        o_hf, s_hf = fn(qe, ke, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        close(o, o_hf), close(s, s_hf)
    # fla's naive functions take neither grouped heads nor l2norm: expand and normalise here
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
    x = inputs(1, N, H, HV, 16, 8, dtype)
    h0 = torch.randn(len(lens), HV, 16, 8)
    check_chunk_varlen(chunk_gated_delta_rule, naive_gated_delta_rule, x, h0, cu, device, dtype, chunk)


@pytest.mark.parametrize("split", [1, 5, 8, 13])
def test_split_prefill_continues_from_final_state(split):
    check_split_prefill(chunk_gated_delta_rule, inputs(2, 21, 2, 4, 16, 8, seed=3), split)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pool_prefill_and_decode_match_naive(device, dtype):
    HV, K, V = 4, 16, 8
    check_pool_prefill_and_decode(gdn_prefill, naive_gdn_prefill, gdn_decode, naive_gdn_decode,
                                  lambda B, T, dt, seed: inputs(B, T, 2, HV, K, V, dt, seed=seed), (HV, K, V),
                                  device, dtype)
