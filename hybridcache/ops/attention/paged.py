"""Paged softmax attention with GQA, vectorized torch (CPU and CUDA).

Pages: ``kv [P, 2, page_size, Hkv, D]`` (0 = key, 1 = value), one layer's slice of the pool role.
New tokens are flat: ``q [N, Hq, D]``, ``k, v [N, Hkv, D]``; row ``b`` owns
``[cu_seqlens[b], cu_seqlens[b + 1])`` at positions ``cached_lens[b] + i``. Prefill over a cached
prefix, decode (one token) and verify (T tokens, causal among them) are the same call.

On CUDA, when triton imports, steps of decode and verify rows run the Triton kernel in
``triton_paged.py`` (pages read in place, no host sync), and writes with a checked page table the one of
``triton_write.py``; the rest run the torch path here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybridcache.ops.attention._batched import (
    BATCH_MAX_NEW,
    RowGroup,
    attend_groups,
    gather_pages,
    masked_attention,
    query_positions,
)
from hybridcache.ops.attention._layout import HostRows, check_rows, copy_into_slots, new_token_positions, token_slots
from hybridcache.ops.triton_support import runs_triton

try:
    from hybridcache.ops.attention.triton_paged import attend_kv_pages_triton
    from hybridcache.ops.attention.triton_write import slot_is_flat, write_kv_triton
except ImportError:  # no triton (CPU installs): the torch path serves every call
    attend_kv_pages_triton = write_kv_triton = None

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_kv(kv: Tensor, k: Tensor, v: Tensor) -> None:
    if kv.ndim != 5 or kv.shape[1] != 2:
        raise ValueError(f"kv pages must be [P, 2, page_size, Hkv, D], got shape {tuple(kv.shape)}")
    if k.shape != v.shape or tuple(k.shape[1:]) != tuple(kv.shape[3:]):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be [N, {kv.shape[3]}, {kv.shape[4]}]")


def write_kv(kv: Tensor, k: Tensor, v: Tensor, page_table: Tensor, cached_lens: Tensor, cu_seqlens: Tensor,
             host: HostRows | None = None) -> None:
    """Write the new tokens' keys and values into their pages, in place.

    kv: [P, 2, page_size, Hkv, D]; k, v: [N, Hkv, D]; page_table: [B, max_pages] int32 (-1 past the
    end); cached_lens: [B]; cu_seqlens: [B + 1]. Raises PageTableError if a token has no page (a host
    sync), unless `host.pages_checked` says the caller checked the table already.
    A checked table on CUDA takes the Triton kernel (one launch, no host sync); the rest the torch path.
    """
    _check_kv(kv, k, v)
    check_rows(page_table, cached_lens, cu_seqlens, k.shape[0])
    if host is not None and host.pages_checked and write_triton(kv, k):
        write_kv_triton(kv, k, v, page_table, cached_lens, cu_seqlens)
        return
    rows, pos = new_token_positions(cached_lens, cu_seqlens, k.shape[0])
    check = host is None or not host.pages_checked
    pages, offsets = token_slots(page_table, rows, pos, kv.shape[2], check=check)
    page_size = kv.shape[2]
    key_slots = pages * (2 * page_size) + offsets  # flat over [P, 2, page_size]; values one page_size later
    copy_into_slots(kv, key_slots, k)
    copy_into_slots(kv, key_slots + page_size, v)


def write_triton(kv: Tensor, k: Tensor) -> bool:
    """Whether ``write_kv`` takes the Triton kernel (host-known facts only; the table must be checked too)."""
    return (
        write_kv_triton is not None
        and runs_triton(k)
        and kv.device == k.device
        and kv.dtype in TRITON_DTYPES
        and slot_is_flat(kv, 2)
    )


def use_triton(q: Tensor, kv: Tensor, page_table: Tensor) -> bool:
    """Whether ``attend_kv_pages`` takes the Triton kernel, decided from host-known facts only.

    A step qualifies when it averages at most BATCH_MAX_NEW new tokens per row (decode and verify
    steps always do). The kernel is correct for any row; a step mostly made of prefill tokens goes
    to the torch path, whose SDPA suits long query blocks better.
    """
    return (
        attend_kv_pages_triton is not None
        and runs_triton(q)
        and kv.device == q.device
        and kv.dtype in TRITON_DTYPES
        and q.shape[-1] <= 256
        and q.shape[0] <= BATCH_MAX_NEW * page_table.shape[0]
    )


def attend_kv_pages(
    q: Tensor,
    kv: Tensor,
    page_table: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
    scale: float | None = None,
    host: HostRows | None = None,
) -> Tensor:
    """Attention of the new tokens over pages that already hold them (read only).

    q: [N, Hq, D]; kv: [P, 2, page_size, Hkv, D]; each row's pages must hold positions
    [0, cached_lens[b] + new tokens). Returns [N, Hq, D] in q's dtype. `host`: the row lengths on the
    host, if the caller knows them (the torch path then reads nothing back).
    """
    num_kv_heads = kv.shape[3]
    if q.ndim != 3 or q.shape[1] % num_kv_heads or q.shape[2] != kv.shape[4]:
        raise ValueError(f"q {tuple(q.shape)} must be [N, a multiple of {num_kv_heads}, {kv.shape[4]}]")
    if use_triton(q, kv, page_table):
        return attend_kv_pages_triton(q, kv, page_table, cached_lens, cu_seqlens, scale)
    return attend_kv_pages_torch(q, kv, page_table, cached_lens, cu_seqlens, scale, host)


def attend_kv_pages_torch(
    q: Tensor,
    kv: Tensor,
    page_table: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
    scale: float | None = None,
    host: HostRows | None = None,
) -> Tensor:
    """The vectorized torch path of ``attend_kv_pages`` (CPU and CUDA; one host sync per call, none with
    `host`)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale

    def attend(group: RowGroup, q_pad: Tensor) -> Tensor:
        keys = gather_pages(kv[:, 0], page_table, group, slot=0)
        values = gather_pages(kv[:, 1], page_table, group, slot=1)
        return masked_attention(q_pad, keys, values, query_positions(group), scale)

    table_len = page_table.shape[1] * kv.shape[2]
    return attend_groups(q.to(kv.dtype), cached_lens, cu_seqlens, tuple(q.shape[1:]), q.dtype, attend, host, table_len)


def paged_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv: Tensor,
    page_table: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
    scale: float | None = None,
    host: HostRows | None = None,
) -> Tensor:
    """Write k/v into the pages, then attend each new token over its row's prefix and new tokens.

    q: [N, Hq, D]; k, v: [N, Hkv, D] with Hq a multiple of Hkv (query head h reads kv head
    h // (Hq // Hkv)); kv: [P, 2, page_size, Hkv, D]. scale defaults to D ** -0.5.
    Returns [N, Hq, D] in q's dtype. Rows with no new tokens read and write nothing.
    host: what the caller knows on the host (row lengths, a checked page table); with it the op makes
    no host sync, without it one or two (the page-table check, the row lengths).
    """
    write_kv(kv, k, v, page_table, cached_lens, cu_seqlens, host)
    return attend_kv_pages(q, kv, page_table, cached_lens, cu_seqlens, scale, host)

