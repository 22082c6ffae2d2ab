"""Stand-ins for flash-linear-attention's chunk kernels (tests/ops/test_prefill_fla.py): fla's names and
keywords, no **kwargs (an unknown keyword raises); each asserts what fla needs of a varlen call, then
computes the reference (our torch `chunk_*` for GDN / KDA, simple GLA one token at a time for Mamba2)."""
from __future__ import annotations

import torch
from torch import Tensor

from hybridcache.ops.fla_kernels import FlaOps
from hybridcache.ops.gdn.chunk import chunk_gated_delta_rule
from hybridcache.ops.kda.chunk import chunk_kda


def fla_preconditions(q: Tensor, initial_state: Tensor, cu_seqlens: Tensor) -> None:
    """What fla needs of our varlen calls; and no NaN of an unused slot may reach it."""
    assert q.shape[0] == 1, "with cu_seqlens fla takes a flat batch"
    assert cu_seqlens.device == q.device and cu_seqlens.dtype in (torch.int32, torch.int64)
    assert initial_state.dtype == torch.float32 and initial_state.shape[0] == cu_seqlens.numel() - 1
    assert torch.isfinite(initial_state).all()


def ref_chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    fla_preconditions(q, initial_state, cu_seqlens)
    o, ht = chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                   use_qk_l2norm_in_kernel)
    return o.to(q.dtype), ht


def ref_chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, cu_seqlens=None):
    fla_preconditions(q, initial_state, cu_seqlens)
    assert not use_gate_in_kernel, "g is already the log-decay"
    o, ht = chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel)
    return o.to(q.dtype), ht


def ref_chunk_simple_gla(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False,
                         state_v_first=False, cu_seqlens=None):
    """Simple GLA from its definition, one token at a time: per head S_t = exp(g_t)·S_{t-1} + k_t v_tᵀ
    [K, V], o_t = scale·S_tᵀ q_t; states [N, H, V, K] when state_v_first. Outputs in q's dtype."""
    fla_preconditions(q, initial_state, cu_seqlens)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o = torch.zeros(*v.shape, device=q.device)
    finals = []
    cu = cu_seqlens.tolist()
    for i in range(len(cu) - 1):
        S = initial_state[i].transpose(-1, -2) if state_v_first else initial_state[i]  # [H, K, V]
        for t in range(cu[i], cu[i + 1]):
            S = S * g[0, t].float().exp()[:, None, None] + k[0, t].float()[:, :, None] * v[0, t].float()[:, None, :]
            o[0, t] = scale * torch.einsum("hkv,hk->hv", S, q[0, t].float())
        finals.append(S.transpose(-1, -2) if state_v_first else S)
    return o.to(q.dtype), (torch.stack(finals) if output_final_state else None)


REFERENCE_OPS = FlaOps(ref_chunk_gated_delta_rule, ref_chunk_kda, ref_chunk_simple_gla)
