"""Multi-head latent attention (Kimi Linear's MLA) over paged latents: vectorized torch, Triton on CUDA.

Pages: ``latent_pages [P, page_size, R + Dr]``: per token the compressed latent ``c`` (after
kv_a_layernorm) and then the rope key shared by all heads (Kimi Linear applies no rotation to it; a
model that does rotates it before the write). ``kv_b_proj`` maps ``c`` to per-head ``k_nope`` and ``v``;
its weight arrives split as ``w_k [H, Dn, R]`` and ``w_v [H, Dv, R]``.

Two equal forms:
- absorbed (decode, verify): ``q_lat = w_k[h]^T q_nope`` turns every head into a query over the
  latent itself: one shared key ``cat(c, k_rope)`` of width R + Dr and one shared value ``c``, so the
  pages are read once for all heads; the output ``w_v[h] @ o_lat`` is projected afterwards.
- expanded (prefill): the row's latents are projected to per-head keys and values, cheaper when many
  queries share them.

On CUDA (when triton imports) a step of decode and verify rows attends in the absorbed form with the
Triton kernel of ``triton_mla.py`` (pages read in place, no gather, no host sync), and a checked page
table's writes take ``triton_write.py``; the rest run the torch code here.
"""

from __future__ import annotations

from collections.abc import Callable

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
from hybridcache.ops.linear import batched_linear
from hybridcache.ops.triton_support import runs_triton

try:
    from hybridcache.ops.attention.triton_mla import mla_attend_triton
    from hybridcache.ops.attention.triton_write import slot_is_flat, write_latent_triton
except ImportError:  # no triton (CPU installs): the torch path serves every call
    mla_attend_triton = write_latent_triton = None

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def write_latent(
    latent_pages: Tensor,
    latent: Tensor,
    k_rope: Tensor,
    page_table: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
    host: HostRows | None = None,
) -> None:
    """Write the new tokens' latent and rope key into their pages, in place.

    latent_pages: [P, page_size, R + Dr]; latent: [N, R]; k_rope: [N, Dr]; page_table: [B, max_pages]
    int32; cached_lens: [B]; cu_seqlens: [B + 1]. Raises PageTableError if a token has no page (a host
    sync), unless `host.pages_checked` says the caller checked the table already.
    A checked table on CUDA takes the Triton kernel (one launch, no host sync); the rest the torch path.
    """
    rank = latent.shape[-1]
    if latent_pages.ndim != 3 or latent_pages.shape[2] != rank + k_rope.shape[-1] or latent.shape[0] != k_rope.shape[0]:
        raise ValueError(
            f"latent pages {tuple(latent_pages.shape)} must be [P, page_size, R + Dr] for latent "
            f"{tuple(latent.shape)} and k_rope {tuple(k_rope.shape)}"
        )
    check_rows(page_table, cached_lens, cu_seqlens, latent.shape[0])
    if (host is not None and host.pages_checked and write_latent_triton is not None and runs_triton(latent)
            and latent_pages.device == latent.device and latent_pages.dtype in TRITON_DTYPES
            and slot_is_flat(latent_pages, 1)):
        write_latent_triton(latent_pages, latent, k_rope, page_table, cached_lens, cu_seqlens)
        return
    rows, pos = new_token_positions(cached_lens, cu_seqlens, latent.shape[0])
    check = host is None or not host.pages_checked
    pages, offsets = token_slots(page_table, rows, pos, latent_pages.shape[1], check=check)
    entries = torch.cat([latent, k_rope], dim=-1)
    copy_into_slots(latent_pages, pages * latent_pages.shape[1] + offsets, entries)


def _absorbed(q_nope: Tensor, q_rope: Tensor, cached: Tensor, w_k: Tensor, w_v: Tensor, q_pos: Tensor, scale: float) -> Tensor:
    """q_nope [Bs,T,H,Dn], q_rope [Bs,T,H,Dr], cached [Bs,L,R+Dr] -> [Bs,T,H,Dv]."""
    rank = w_k.shape[-1]
    q_lat = torch.einsum("bthd,hdr->bthr", q_nope.float(), w_k.float()).to(cached.dtype)
    query = torch.cat([q_lat, q_rope.to(cached.dtype)], dim=-1)
    keys = cached[:, :, None, :]  # one kv head shared by all H query heads
    # Values are the latent c = keys[..., :R]; passing all of keys and dropping the rope columns of the
    # output keeps SDPA on its fused CPU kernel (it falls back to a slow path when Dv != Dk).
    o_lat = masked_attention(query, keys, keys, q_pos, scale)[..., :rank]
    return torch.einsum("bthr,hvr->bthv", o_lat.float(), w_v.float())


def _expanded(q_nope: Tensor, q_rope: Tensor, cached: Tensor, w_k: Tensor, w_v: Tensor, q_pos: Tensor, scale: float) -> Tensor:
    """Same contract as _absorbed, with keys and values projected per head."""
    rank, heads = w_k.shape[-1], w_k.shape[0]
    c, rope_keys = cached[..., :rank], cached[..., rank:]
    k_nope = torch.einsum("blr,hdr->blhd", c, w_k.to(c.dtype))
    keys = torch.cat([k_nope, rope_keys[:, :, None, :].expand(-1, -1, heads, -1)], dim=-1)
    values = torch.einsum("blr,hvr->blhv", c, w_v.to(c.dtype))
    query = torch.cat([q_nope, q_rope], dim=-1).to(cached.dtype)
    return masked_attention(query, keys, values, q_pos, scale)


def mla_paged_attention(
    q_nope: Tensor,
    q_rope: Tensor,
    latent: Tensor,
    k_rope: Tensor,
    latent_pages: Tensor,
    page_table: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
    w_k: Tensor,
    w_v: Tensor,
    scale: float | None = None,
    absorb: bool | None = None,
    host: HostRows | None = None,
) -> Tensor:
    """Write the new latents into the pages, then MLA of each new token over its row.

    q_nope: [N, H, Dn]; q_rope: [N, H, Dr]; latent: [N, R]; k_rope: [N, Dr];
    latent_pages: [P, page_size, R + Dr]; w_k: [H, Dn, R]; w_v: [H, Dv, R]
    (``kv_b_proj.weight.view(H, Dn + Dv, R).split([Dn, Dv], dim=1)``). scale defaults to
    (Dn + Dr) ** -0.5. absorb: True / False forces a form; None picks absorbed for groups of short
    rows (decode, verify) and expanded for prefill rows. Returns [N, H, Dv] in q_nope's dtype.
    host: what the caller knows on the host (row lengths, a checked page table); with it the op makes
    no host sync, without it two (the page-table check, the row lengths).
    """
    write_latent(latent_pages, latent, k_rope, page_table, cached_lens, cu_seqlens, host)
    heads, dv = w_v.shape[0], w_v.shape[1]
    if q_nope.shape[1] != heads or w_k.shape[0] != heads or w_k.shape[-1] != latent.shape[-1]:
        raise ValueError(f"q_nope {tuple(q_nope.shape)}, w_k {tuple(w_k.shape)}, w_v {tuple(w_v.shape)} disagree")
    scale = (q_nope.shape[-1] + q_rope.shape[-1]) ** -0.5 if scale is None else scale
    if absorb is not False and use_triton(q_nope, latent_pages, page_table):
        return absorbed_triton(q_nope, q_rope, latent_pages, page_table, cached_lens, cu_seqlens, w_k, w_v, scale)
    queries = torch.cat([q_nope, q_rope], dim=-1)
    dn = q_nope.shape[-1]

    def attend(group: RowGroup, q_pad: Tensor) -> Tensor:
        form = _pick_form(group, absorb)
        cached = gather_pages(latent_pages, page_table, group, slot=0)
        return form(q_pad[..., :dn], q_pad[..., dn:], cached, w_k, w_v, query_positions(group), scale)

    table_len = page_table.shape[1] * latent_pages.shape[1]
    return attend_groups(queries, cached_lens, cu_seqlens, (heads, dv), q_nope.dtype, attend, host, table_len)


def _pick_form(group: RowGroup, absorb: bool | None) -> Callable[..., Tensor]:
    if absorb is None:
        absorb = group.max_new <= BATCH_MAX_NEW
    return _absorbed if absorb else _expanded


def use_triton(q_nope: Tensor, latent_pages: Tensor, page_table: Tensor) -> bool:
    """Whether ``mla_paged_attention`` attends with the Triton kernel (absorbed form), from host-known facts:
    a step averaging at most BATCH_MAX_NEW new tokens per row (decode, verify) on CUDA. A step mostly of
    prefill tokens keeps the torch path, whose expanded form suits long query blocks better."""
    return (
        mla_attend_triton is not None
        and runs_triton(q_nope)
        and latent_pages.device == q_nope.device
        and latent_pages.dtype in TRITON_DTYPES
        and latent_pages.stride(-1) == 1
        and q_nope.shape[0] <= BATCH_MAX_NEW * page_table.shape[0]
    )


def absorbed_triton(q_nope: Tensor, q_rope: Tensor, latent_pages: Tensor, page_table: Tensor, cached_lens: Tensor,
                    cu_seqlens: Tensor, w_k: Tensor, w_v: Tensor, scale: float) -> Tensor:
    """The absorbed form over pages that already hold the new tokens, pages read in place (one Triton
    launch, two with key splits) between two batched GEMMs (`linear.batched_linear`): ``q_lat[h] = q_nope[h]
    w_k[h]`` and ``o[h] = o_lat[h] w_v[h]^T``, in the pages' dtype. Same arguments as ``mla_paged_attention``;
    returns [N, H, Dv] in q_nope's dtype (a transposed view of an [H, N, Dv] tensor)."""
    dtype, (n, heads), rank = latent_pages.dtype, q_nope.shape[:2], w_k.shape[-1]
    q_lat = batched_linear(q_nope.transpose(0, 1).to(dtype), w_k.to(dtype).transpose(1, 2))  # [H, N, R]
    o_lat = torch.empty(heads, n, rank, dtype=dtype, device=q_nope.device)
    mla_attend_triton(q_lat.transpose(0, 1), q_rope.to(dtype), latent_pages, page_table, cached_lens, cu_seqlens,
                      scale, out=o_lat.transpose(0, 1))
    return batched_linear(o_lat, w_v.to(dtype)).transpose(0, 1).to(q_nope.dtype)  # [H, N, Dv] viewed
