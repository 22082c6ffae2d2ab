"""The plumbing Gated DeltaNet and KDA share around their block math: varlen chunking for prefill, the
slot-facing prefill and decode wrappers, and the token-major -> head-major layout change.

The math stays in each op's `block.py` and is passed in: GDN's log-decay g is one scalar per value head
(`[.., HV]`, value heads a multiple of key heads), KDA's one per key channel (`[.., H, K]`). Nothing here
looks at g past its time dim. No host sync (prefill reads the sequence lengths once, in `pack_index`).
"""
from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from .slot_io import put_rows, read_rows
from .varlen import pack, pack_index

# block(h0 [B, HV, K, V], q, k [B, H, L, K], v [B, HV, L, V], g, beta) -> (o [B, HV, L, V], h after the block)
Block = Callable[..., tuple[Tensor, Tensor]]
# prepare_qk(q, k [B, T, H, K], scale, use_qk_l2norm_in_kernel) -> fp32 [B, H, T, K] (q scaled)
PrepareQK = Callable[[Tensor, Tensor, float | None, bool], tuple[Tensor, Tensor]]
# the op's `chunk_*` function (fla's contract)
ChunkFn = Callable[..., tuple[Tensor, Tensor | None]]


class RawGateInputs(Protocol):
    """A layer's raw gate inputs that compute (g, beta) themselves (`gdn.RawGate`, `kda.KDARawGate`)."""

    def values(self) -> tuple[Tensor, Tensor]: ...


def gate_values(g: Tensor | None, beta: Tensor | None, gate: RawGateInputs | None) -> tuple[Tensor, Tensor]:
    """(g, beta) given directly, or computed from `gate` (exactly one of the two forms)."""
    if gate is None:
        assert g is not None and beta is not None, "pass g and beta, or gate="
        return g, beta
    assert g is None and beta is None, "pass g and beta, or gate=, not both"
    return gate.values()


def head_major(*xs: Tensor) -> tuple[Tensor, ...]:
    """Each x [B, T, H, ...] -> fp32 [B, H, T, ...] (v, g, beta as the blocks take them)."""
    return tuple(x.float().transpose(1, 2) for x in xs)


def chunked(block: Block, prepare_qk: PrepareQK, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
            scale: float | None, initial_state: Tensor | None, output_final_state: bool, cu_seqlens: Tensor | None,
            use_qk_l2norm_in_kernel: bool, chunk_size: int) -> tuple[Tensor, Tensor | None]:
    """fla's `chunk_*` contract over `block`: q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV, ...].

    Sequences (rows, or the `cu_seqlens [N+1]` spans of a flat B = 1 batch) are packed into padded rows
    and run `chunk_size` tokens at a time; padding tokens are zero (g = 0, beta = 0) and leave the state
    alone. Returns o [B, T, HV, V] in v's dtype and the fp32 final state [N, HV, K, V] if asked.
    """
    if cu_seqlens is None:
        B, T = q.shape[:2]
        cu_seqlens = torch.arange(0, (B + 1) * T, T, device=q.device)
        q, k, v, g, beta = (x.flatten(0, 1)[None] for x in (q, k, v, g, beta))
    else:
        assert q.shape[0] == 1, "with cu_seqlens the batch must be flat (B = 1)"
        B, T = 1, q.shape[1]
    gather, scatter = pack_index(cu_seqlens, chunk_size)
    n, hv, dk, dv = gather.shape[0], v.shape[2], k.shape[-1], v.shape[-1]
    qp, kp = prepare_qk(pack(q[0], gather), pack(k[0], gather), scale, use_qk_l2norm_in_kernel)
    vp, gp, bp = (pack(x[0].float(), gather).transpose(1, 2) for x in (v, g, beta))  # time is dim 2 of each
    h = q.new_zeros(n, hv, dk, dv, dtype=torch.float32)
    if initial_state is not None:
        h = initial_state.float().clone()
    outs = []
    for s in range(0, gather.shape[1], chunk_size):
        c = slice(s, s + chunk_size)
        o, h = block(h, qp[:, :, c], kp[:, :, c], vp[:, :, c], gp[:, :, c], bp[:, :, c])
        outs.append(o)
    o = torch.cat(outs, dim=-2).transpose(1, 2).flatten(0, 1)[scatter]
    return o.to(v.dtype).view(B, T, hv, dv), (h if output_final_state else None)


def prefill_slots(chunk_fn: ChunkFn, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu_seqlens: Tensor,
                  ssm: Tensor, slots: Tensor, has_initial: Tensor, scale: float | None,
                  use_qk_l2norm_in_kernel: bool, chunk_size: int) -> Tensor:
    """`chunk_fn` over a flat batch [N, ...] starting from ssm[slot] (zeros where has_initial is false or
    the slot is padding); writes each live row's final state to ssm[slot]. Returns o [N, HV, V]."""
    h0 = read_rows(ssm, slots, has_initial)
    o, h = chunk_fn(
        q[None], k[None], v[None], g[None], beta[None], scale, h0, True, cu_seqlens,
        use_qk_l2norm_in_kernel, chunk_size,
    )
    put_rows(ssm, (slots,), h, slots >= 0)
    return o[0]


def decode_slots(block: Block, prepare_qk: PrepareQK, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                 ssm: Tensor, slots: Tensor, has_initial: Tensor | None, scale: float | None,
                 use_qk_l2norm_in_kernel: bool) -> Tensor:
    """T tokens per row [B, T, ...] as one block from ssm[slot] (zeros where has_initial is false);
    writes the state after the last token back. Returns o [B, T, HV, V] in v's dtype."""
    qh, kh = prepare_qk(q, k, scale, use_qk_l2norm_in_kernel)
    h0 = read_rows(ssm, slots, has_initial)
    o, h = block(h0, qh, kh, *head_major(v, g, beta))
    put_rows(ssm, (slots,), h, slots >= 0)
    return o.transpose(1, 2).to(v.dtype)
