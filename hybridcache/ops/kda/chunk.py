"""Chunked KDA for prefill: variable-length flat batches, initial and final state."""
import torch

from ..gdn.pool_io import read_rows
from ..slot_io import put_rows
from ..gdn.varlen import pack, pack_index
from .block import block, prepare_qk


def chunk_kda(
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
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla's `chunk_kda` contract (value heads = key heads).

    q, k, g [B, T, H, K] (g: per-channel log-decay); v [B, T, H, V]; beta [B, T, H]; initial_state
    [B, H, K, V]. With `cu_seqlens [N+1]` the batch is flat (B = 1) and states are [N, H, K, V].
    Returns o [B, T, H, V] in v's dtype and the fp32 final state if asked.
    """
    if cu_seqlens is None:
        B, T = q.shape[:2]
        cu_seqlens = torch.arange(0, (B + 1) * T, T, device=q.device)
        q, k, v, g, beta = (x.flatten(0, 1)[None] for x in (q, k, v, g, beta))
    else:
        assert q.shape[0] == 1, "with cu_seqlens the batch must be flat (B = 1)"
        B, T = 1, q.shape[1]
    gather, scatter = pack_index(cu_seqlens, chunk_size)
    n, H, dk, dv = gather.shape[0], v.shape[2], k.shape[-1], v.shape[-1]
    qp, kp = prepare_qk(pack(q[0], gather), pack(k[0], gather), scale, use_qk_l2norm_in_kernel)
    vp, gp, bp = (pack(x[0].float(), gather).transpose(1, 2) for x in (v, g, beta))
    h = q.new_zeros(n, H, dk, dv, dtype=torch.float32)
    if initial_state is not None:
        h = initial_state.float().clone()
    outs = []
    for s in range(0, gather.shape[1], chunk_size):
        c = slice(s, s + chunk_size)
        o, h = block(h, qp[..., c, :], kp[..., c, :], vp[..., c, :], gp[..., c, :], bp[..., c])
        outs.append(o)
    o = torch.cat(outs, dim=-2).transpose(1, 2).flatten(0, 1)[scatter]
    return o.to(v.dtype).view(B, T, H, dv), (h if output_final_state else None)


def kda_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    ssm: torch.Tensor,
    slots: torch.Tensor,
    has_initial: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Prefill chunks of B requests against the pool.

    q, k, g [N, H, K]; v [N, H, V]; beta [N, H]; cu_seqlens [B+1]; ssm [S, H, K, V] fp32 (one layer);
    slots [B] (negative = padding); has_initial [B] bool. Writes each live row's final state to ssm[slot];
    returns o [N, H, V].
    """
    h0 = read_rows(ssm, slots, has_initial)
    o, h = chunk_kda(
        q[None], k[None], v[None], g[None], beta[None], scale, h0, True, cu_seqlens,
        use_qk_l2norm_in_kernel, chunk_size,
    )
    put_rows(ssm, (slots,), h, slots >= 0)
    return o[0]
