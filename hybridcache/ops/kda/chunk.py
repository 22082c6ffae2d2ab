"""Chunked KDA for prefill: variable-length flat batches, initial and final state.

`chunk_kda` is our torch path (fla's contract, any device). The slot-facing `kda_prefill` runs fla's
Triton chunk kernel where `fla_usable` says so (CUDA; see ops/fla_kernels.py) and the torch path
elsewhere; either way the slots are read and written the same way (`prefill_slots`).
"""
import torch

from ..delta_rule_common import chunked, prefill_slots
from ..fla_kernels import MAX_KEY_DIM, fla_chunk_kda, fla_usable
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
    return chunked(block, prepare_qk, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                   use_qk_l2norm_in_kernel, chunk_size)


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
    returns o [N, H, V] in v's dtype.
    On CUDA (`fla_usable`) fla's kernel runs (`kda_prefill_fla`); `chunk_size` tiles the torch path only.
    """
    if fla_usable(q) and q.shape[-1] <= MAX_KEY_DIM:
        return kda_prefill_fla(q, k, v, g, beta, cu_seqlens, ssm, slots, has_initial, scale,
                               use_qk_l2norm_in_kernel)
    return prefill_slots(chunk_kda, q, k, v, g, beta, cu_seqlens, ssm, slots, has_initial, scale,
                         use_qk_l2norm_in_kernel, chunk_size)


def kda_prefill_fla(
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
    """`kda_prefill` on fla's `chunk_kda` (varlen; g is the per-channel log-decay, already gated by
    `kda_gate`, so fla's in-kernel gate stays off).

    Initial states are gathered from ssm[slot] in fp32 (fla asserts fp32; zeros, by a fill, where
    has_initial is false or the row is padding, so NaN in unused slots never reaches the kernel); the
    final states are written back to the live rows' slots. No host sync here beyond fla's own reads of
    cu_seqlens (ops/fla_kernels.py).
    """
    return prefill_slots(fla_chunk_kda, q, k, v, g, beta, cu_seqlens, ssm, slots, has_initial, scale,
                         use_qk_l2norm_in_kernel, chunk_size)
