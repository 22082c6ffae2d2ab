"""Readable references for the KDA ops: one token at a time, one row at a time.

Argument order follows flash-linear-attention (q, k, v, g, beta, scale, initial_state, output_final_state);
the pool-facing references take the same arguments as their fast counterparts.
"""
import torch
from torch import Tensor

from ..delta_rule_naive import decode_rows, prefill_rows, scaled_qk, spans


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x / sqrt(sum(x²) + eps)` over the last dim, as transformers' kimi_linear does (fla's Triton form)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def _token(h: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """One state update, fp32. h [H, K, V]; k, g [H, K]; v [H, V]; beta [H] -> h."""
    h = h * g.exp()[:, :, None]
    u = beta[:, None] * (v - torch.einsum("hkv,hk->hv", h, k))
    return h + k[:, :, None] * u[:, None, :]


def _read(h: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return torch.einsum("hkv,hk->hv", h, q)


def naive_kda(
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
    """q, k, g [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; initial_state [B, H, K, V].

    With cu_seqlens [N+1] the batch is flat (B = 1) and states are [N, H, K, V].
    Returns o [B, T, H, V] (v's dtype) and the fp32 final state if asked.
    """
    B, T, H, dv = *v.shape[:3], v.shape[-1]
    qs, ks = scaled_qk(q, k, scale, _l2norm if use_qk_l2norm_in_kernel else None)
    o = torch.zeros(B, T, H, dv)
    finals = []
    for i, (b, start, end) in enumerate(spans(B, T, cu_seqlens)):
        h = torch.zeros(H, k.shape[-1], dv) if initial_state is None else initial_state[i].float()
        for t in range(start, end):
            h = _token(h, ks[b, t], v[b, t].float(), g[b, t].float(), beta[b, t].float())
            o[b, t] = _read(h, qs[b, t])
        finals.append(h)
    return o.to(v.dtype), (torch.stack(finals) if output_final_state else None)


def naive_kda_prefill(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor, ssm: Tensor,
                      slots: Tensor, has_initial: Tensor, scale: float | None = None,
                      use_qk_l2norm_in_kernel: bool = False, chunk_size: int = 64) -> torch.Tensor:
    """Reference of `kda_prefill`: q, k, g [N, H, K]; v [N, H, V]; beta [N, H]; returns o [N, H, V]."""
    return prefill_rows(naive_kda, q, k, v, g, beta, cu_seqlens, ssm, slots, has_initial, scale,
                        use_qk_l2norm_in_kernel)


def naive_kda_decode(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, ssm: Tensor, slots: Tensor,
                     has_initial: Tensor | None = None, scale: float | None = None,
                     use_qk_l2norm_in_kernel: bool = False) -> torch.Tensor:
    """Reference of `kda_decode`: q, k, g [B, T, H, K]; v [B, T, H, V]; returns o [B, T, H, V]."""
    return decode_rows(naive_kda, q, k, v, g, beta, ssm, slots, has_initial, scale, use_qk_l2norm_in_kernel)


def _replay_pending(h: Tensor, pend_k: Tensor, pend_g: Tensor, pend_v: Tensor, pend_beta: Tensor, slot: int,
                    n: int) -> torch.Tensor:
    for j in range(n):
        h = _token(h, pend_k[slot, j].float(), pend_v[slot, j].float(), pend_g[slot, j].float(),
                   pend_beta[slot, j].float())
    return h


def naive_kda_effective_state(ssm: Tensor, pend_k: Tensor, pend_g: Tensor, pend_v: Tensor, pend_beta: Tensor,
                              pend_n: Tensor, slots: Tensor) -> torch.Tensor:
    """Reference of `kda_effective_state`: returns [B, H, K, V] (zeros for padding rows)."""
    out = torch.zeros(len(slots), *ssm.shape[1:])
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            out[i] = _replay_pending(ssm[slot].float(), pend_k, pend_g, pend_v, pend_beta, slot, int(pend_n[slot]))
    return out


def naive_kda_verify(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, ssm: Tensor, pend_k: Tensor,
                     pend_g: Tensor, pend_v: Tensor, pend_beta: Tensor, pend_n: Tensor, slots: Tensor,
                     scale: float | None = None, use_qk_l2norm_in_kernel: bool = False) -> torch.Tensor:
    """Reference of `kda_verify` (docs/layouts.md): returns o [B, T, H, V]."""
    T = q.shape[1]
    qs, ks = scaled_qk(q, k, scale, _l2norm if use_qk_l2norm_in_kernel else None)
    o = torch.zeros(v.shape, dtype=v.dtype)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        h = _replay_pending(ssm[slot].float(), pend_k, pend_g, pend_v, pend_beta, slot, int(pend_n[slot]))
        for t in range(T):
            h = _token(h, ks[i, t], v[i, t].float(), g[i, t].float(), beta[i, t].float())
            o[i, t] = _read(h, qs[i, t])
            if t == 0:
                ssm[slot] = h
            else:
                pend_k[slot, t - 1], pend_g[slot, t - 1] = ks[i, t], g[i, t].float()
                pend_v[slot, t - 1], pend_beta[slot, t - 1] = v[i, t], beta[i, t].float()
    return o
