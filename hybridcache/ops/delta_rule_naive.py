"""Plain loops the Gated DeltaNet and KDA references share: q/k preparation, sequence spans, and running a
sequence reference (fla's `naive_*` contract) one request at a time against the pool.

Nothing here does the recurrence (each op's `naive.py` keeps its own token step: a per-head decay for GDN,
a per-key-channel decay for KDA) and nothing here imports a fast path.
"""
from collections.abc import Callable

import torch
from torch import Tensor

# seq_ref(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel=...) -> (o, h)
SeqRef = Callable[..., tuple[Tensor, Tensor | None]]


def scaled_qk(q: Tensor, k: Tensor, scale: float | None, l2norm: Callable[[Tensor], Tensor] | None) -> tuple[Tensor, Tensor]:
    """q, k [..., K] -> fp32, both normalised by `l2norm` if given, q scaled (default K ** -0.5)."""
    q, k = q.float(), k.float()
    if l2norm is not None:
        q, k = l2norm(q), l2norm(k)
    return q * (q.shape[-1] ** -0.5 if scale is None else scale), k


def spans(batch: int, steps: int, cu_seqlens: Tensor | None) -> list[tuple[int, int, int]]:
    """(batch row, first token, end token) of each sequence: `batch` rows of `steps` tokens, or with
    `cu_seqlens [N+1]` the N spans of a flat batch (row 0)."""
    if cu_seqlens is None:
        return [(b, 0, steps) for b in range(batch)]
    cu = cu_seqlens.tolist()
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def prefill_rows(seq_ref: SeqRef, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor,
                 ssm: Tensor, slots: Tensor, has_initial: Tensor, scale: float | None,
                 use_qk_l2norm_in_kernel: bool) -> Tensor:
    """Each live row's span [cu[i], cu[i+1]) of a flat batch [N, ...] through `seq_ref`, from ssm[slot] (or
    zeros where has_initial is false); writes the final state to ssm[slot]. Returns o [N, HV, V]."""
    o = torch.zeros(v.shape, dtype=v.dtype)
    cu = cu_seqlens.tolist()
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        span = slice(cu[i], cu[i + 1])
        h0 = ssm[slot].float() if bool(has_initial[i]) else torch.zeros_like(ssm[slot], dtype=torch.float32)
        o_i, h = seq_ref(q[None, span], k[None, span], v[None, span], g[None, span], beta[None, span], scale,
                         h0[None], True, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        o[span], ssm[slot] = o_i[0], h[0]
    return o


def decode_rows(seq_ref: SeqRef, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, ssm: Tensor,
                slots: Tensor, has_initial: Tensor | None, scale: float | None,
                use_qk_l2norm_in_kernel: bool) -> Tensor:
    """T tokens per row [B, T, ...]: a prefill of B sequences of T tokens (has_initial None: all start
    from ssm[slot]). Returns o [B, T, HV, V]."""
    batch, steps = q.shape[:2]
    cu_seqlens = torch.arange(0, (batch + 1) * steps, steps)
    starts = torch.ones(batch, dtype=torch.bool) if has_initial is None else has_initial
    flat = (x.flatten(0, 1) for x in (q, k, v, g, beta))
    o = prefill_rows(seq_ref, *flat, cu_seqlens, ssm, slots, starts, scale, use_qk_l2norm_in_kernel)
    return o.view(v.shape)
