"""Readable references for the Gated DeltaNet ops: one token at a time, one row at a time.

Argument order follows flash-linear-attention's public functions and transformers (q, k, v, g, beta, scale,
initial_state, output_final_state); note fla's own `naive_recurrent_gated_delta_rule` takes beta before g.
The pool-facing references take the same arguments as their fast counterparts.
"""
import torch
from torch import Tensor

from ..delta_rule_naive import decode_rows, prefill_rows, scaled_qk, spans


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x * rsqrt(sum(x²) + eps)` over the last dim, as transformers' qwen3_next and fla do (not F.normalize)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _token(h: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
           beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token, fp32. h [HV, K, V]; q, k [HV, K] (q scaled); v [HV, V]; g, beta [HV] -> (o [HV, V], h, u [HV, V])."""
    h = h * g.exp()[:, None, None]
    u = beta[:, None] * (v - torch.einsum("hkv,hk->hv", h, k))
    h = h + k[:, :, None] * u[:, None, :]
    return torch.einsum("hkv,hk->hv", h, q), h, u


def _prep(q: Tensor, k: Tensor, hv: int, scale: float | None, norm: bool) -> tuple[Tensor, Tensor]:
    """q, k [..., H, K] -> fp32 [..., HV, K] (key heads repeated per value head), normalised if asked, q scaled."""
    q, k = scaled_qk(q, k, scale, _l2norm if norm else None)
    r = hv // k.shape[-2]
    return q.repeat_interleave(r, dim=-2), k.repeat_interleave(r, dim=-2)


def naive_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; initial_state [B, HV, K, V].

    With cu_seqlens [N+1] the batch is flat (B = 1) and the states are [N, HV, K, V].
    Returns o [B, T, HV, V] (v's dtype) and the fp32 final state if asked.
    """
    B, T, hv, dv = *v.shape[:3], v.shape[-1]
    qs, ks = _prep(q, k, hv, scale, use_qk_l2norm_in_kernel)
    o = torch.zeros(B, T, hv, dv)
    finals = []
    for i, (b, start, end) in enumerate(spans(B, T, cu_seqlens)):
        h = torch.zeros(hv, k.shape[-1], dv) if initial_state is None else initial_state[i].float()
        for t in range(start, end):
            o[b, t], h, _ = _token(h, qs[b, t], ks[b, t], v[b, t].float(), g[b, t].float(), beta[b, t].float())
        finals.append(h)
    return o.to(v.dtype), (torch.stack(finals) if output_final_state else None)


def naive_gdn_prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, ssm: Tensor,
                      slots: Tensor, has_initial: Tensor, scale: float | None = None,
                      use_qk_l2norm_in_kernel: bool = False, chunk_size: int = 64) -> torch.Tensor:
    """Reference of `gdn_prefill`: q, k [N, H, K]; v [N, HV, V]; g, beta [N, HV]; returns o [N, HV, V]."""
    return prefill_rows(naive_gated_delta_rule, q, k, v, g, beta, cu_seqlens, ssm, slots, has_initial, scale,
                        use_qk_l2norm_in_kernel)


def naive_gdn_decode(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, ssm: Tensor, slots: Tensor,
                     has_initial: Tensor | None = None, scale: float | None = None,
                     use_qk_l2norm_in_kernel: bool = False) -> torch.Tensor:
    """Reference of `gdn_decode`: q, k [B, T, H, K]; v [B, T, HV, V]; returns o [B, T, HV, V]."""
    return decode_rows(naive_gated_delta_rule, q, k, v, g, beta, ssm, slots, has_initial, scale,
                       use_qk_l2norm_in_kernel)


def _replay(h: Tensor, replay_u: Tensor, replay_k: Tensor, replay_G: Tensor, slot: int, p: int,
            b: int) -> tuple[Tensor, Tensor]:
    """Feed history tokens [0, p) of buffer b into checkpoint h one by one -> (state, G of the last one [HV])."""
    hv = h.shape[0]
    G_prev = torch.zeros(hv)
    for j in range(p):
        key = replay_k[slot, b, j].float().repeat_interleave(hv // replay_k.shape[3], dim=0)
        G_j = replay_G[slot, b, :, j].float()
        h = h * (G_j - G_prev).exp()[:, None, None] + key[:, :, None] * replay_u[slot, b, j].float()[:, None, :]
        G_prev = G_j
    return h, G_prev


def naive_gdn_replay_state(ssm: Tensor, replay_u: Tensor, replay_k: Tensor, replay_G: Tensor, pnat: Tensor,
                           buf_idx: Tensor, slots: Tensor) -> torch.Tensor:
    """Reference of `gdn_replay_state`: returns [B, HV, K, V] (zeros for padding rows)."""
    out = torch.zeros(len(slots), *ssm.shape[1:])
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            out[i] = _replay(ssm[slot].float(), replay_u, replay_k, replay_G, slot,
                             int(pnat[slot]), int(buf_idx[slot]))[0]
    return out


def naive_gdn_verify(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, ssm: Tensor, replay_u: Tensor,
                     replay_k: Tensor, replay_G: Tensor, replay_beta: Tensor, pnat: Tensor, buf_idx: Tensor,
                     slots: Tensor, scale: float | None = None, use_qk_l2norm_in_kernel: bool = False) -> torch.Tensor:
    """Reference of `gdn_verify` (docs/layouts.md): returns o [B, T, HV, V]."""
    T, hv, hist = q.shape[1], v.shape[2], replay_u.shape[2]
    qs, ks = _prep(q, k, hv, scale, use_qk_l2norm_in_kernel)
    kn = _l2norm(k.float()) if use_qk_l2norm_in_kernel else k.float()
    o = torch.zeros(v.shape, dtype=v.dtype)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        p, b = int(pnat[slot]), int(buf_idx[slot])
        h, G = _replay(ssm[slot].float(), replay_u, replay_k, replay_G, slot, p, b)
        if p + T > hist:
            ssm[slot] = h
            G, b, p = torch.zeros(hv), 1 - b, 0
        for t in range(T):
            o[i, t], h, u = _token(h, qs[i, t], ks[i, t], v[i, t].float(), g[i, t].float(), beta[i, t].float())
            G = G + g[i, t].float()
            replay_u[slot, b, p + t] = u
            replay_k[slot, b, p + t] = kn[i, t]
            replay_G[slot, b, :, p + t] = G
            replay_beta[slot, b, :, p + t] = beta[i, t].float()
    return o
