"""Readable references for paged softmax attention (GQA) and MLA: one row at a time, plain softmax in fp32.

Same signatures as the fast functions in ``paged.py`` and ``mla.py``. Pages follow docs/layouts.md:
``kv [P, 2, page_size, Hkv, D]`` (0 = key, 1 = value) and MLA ``latent [P, page_size, R + Dr]``.
A step's new tokens are flat ``[N, ...]``; row ``b`` owns ``[cu_seqlens[b], cu_seqlens[b + 1])`` and its
tokens take the positions ``cached_lens[b] + i``. Each new token attends to every earlier position of
its row and to itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from hybridcache.ops.attention import PageTableError  # the error type both paths raise, not fast code


def _check_rows(page_table: Tensor, cached_lens: Tensor, cu_seqlens: Tensor, num_tokens: int) -> None:
    """Shape and dtype checks of the index tensors (ValueError; the fast path makes the same).

    page_table: [B, max_pages] int; cached_lens: [B] int; cu_seqlens: [B + 1] int.
    """
    if page_table.ndim != 2:
        raise ValueError(f"page_table must be [B, max_pages], got shape {tuple(page_table.shape)}")
    batch = page_table.shape[0]
    if tuple(cached_lens.shape) != (batch,):
        raise ValueError(f"cached_lens must be [{batch}], got shape {tuple(cached_lens.shape)}")
    if tuple(cu_seqlens.shape) != (batch + 1,):
        raise ValueError(f"cu_seqlens must be [{batch + 1}], got shape {tuple(cu_seqlens.shape)}")
    for name, t in (("page_table", page_table), ("cached_lens", cached_lens), ("cu_seqlens", cu_seqlens)):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
    if num_tokens < 0:
        raise ValueError(f"negative token count {num_tokens}")


def _slot(page_table: Tensor, row: int, pos: int, page_size: int) -> tuple[int, int]:
    col = pos // page_size
    page = int(page_table[row, col]) if col < page_table.shape[1] else -1
    if page < 0:
        raise PageTableError(f"row {row} has no page for position {pos}")
    return page, pos % page_size


def _row_slots(page_table: Tensor, row: int, length: int, page_size: int) -> tuple[Tensor, Tensor]:
    """Pages and offsets [length] of positions 0..length-1 of a row."""
    pos = torch.arange(length, device=page_table.device)
    if length and (length - 1) // page_size >= page_table.shape[1]:
        raise PageTableError(f"row {row} has no page for position {length - 1}")
    pages = page_table[row, pos // page_size].long()
    if bool((pages < 0).any()):
        raise PageTableError(f"row {row} has no page for position {int(pos[pages < 0][0])}")
    return pages, pos % page_size


def _row_spans(cached_lens: Tensor, cu_seqlens: Tensor) -> list[tuple[int, int, int]]:
    """(first new token, number of new tokens, cached length) of each row."""
    cu = cu_seqlens.tolist()
    return [(cu[b], cu[b + 1] - cu[b], int(cached_lens[b])) for b in range(len(cu) - 1)]


def _new_token_slots(
    page_table: Tensor, cached_lens: Tensor, cu_seqlens: Tensor, page_size: int
) -> Iterator[tuple[int, int, int]]:
    """(flat index, page, offset) of every new token, row after row."""
    for row, (start, count, cached) in enumerate(_row_spans(cached_lens, cu_seqlens)):
        for i in range(count):
            yield (start + i, *_slot(page_table, row, cached + i, page_size))


def _rows_to_attend(
    page_table: Tensor, cached_lens: Tensor, cu_seqlens: Tensor, page_size: int
) -> Iterator[tuple[slice, int, Tensor, Tensor]]:
    """For each row with new tokens: (its new tokens in the flat order, cached length, pages and offsets of
    its positions 0..cached + count - 1)."""
    for row, (start, count, cached) in enumerate(_row_spans(cached_lens, cu_seqlens)):
        if count == 0:
            continue
        pages, offsets = _row_slots(page_table, row, cached + count, page_size)
        yield slice(start, start + count), cached, pages, offsets


def _causal_softmax(scores: Tensor, cached: int) -> Tensor:
    """scores [H, T, n] of T new tokens over n = cached + T positions -> probabilities."""
    t, n = scores.shape[-2:]
    query_pos = cached + torch.arange(t, device=scores.device)
    future = torch.arange(n, device=scores.device)[None, :] > query_pos[:, None]
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1)


def write_kv(kv: Tensor, k: Tensor, v: Tensor, page_table: Tensor, cached_lens: Tensor, cu_seqlens: Tensor) -> None:
    """Write the new tokens' keys and values into their pages, in place.

    kv: [P, 2, page_size, Hkv, D]; k, v: [N, Hkv, D]; page_table: [B, max_pages] int32;
    cached_lens: [B]; cu_seqlens: [B + 1].
    """
    _check_rows(page_table, cached_lens, cu_seqlens, k.shape[0])
    for n, page, offset in _new_token_slots(page_table, cached_lens, cu_seqlens, kv.shape[2]):
        kv[page, 0, offset] = k[n]
        kv[page, 1, offset] = v[n]


def paged_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv: Tensor,
    page_table: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
    scale: float | None = None,
) -> Tensor:
    """Reference of ``paged.paged_attention`` (same contract): write k/v, then per row repeat the kv heads
    to the query heads and take a plain causal softmax over the row's positions. Returns [N, Hq, D]."""
    write_kv(kv, k, v, page_table, cached_lens, cu_seqlens)
    group = q.shape[1] // kv.shape[3]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.zeros(q.shape[0], q.shape[1], kv.shape[-1], dtype=q.dtype, device=q.device)
    for rows, cached, pages, offsets in _rows_to_attend(page_table, cached_lens, cu_seqlens, kv.shape[2]):
        keys = kv[pages, 0, offsets].float().repeat_interleave(group, dim=1)  # [n, Hq, D]
        values = kv[pages, 1, offsets].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,nhd->htn", q[rows].float(), keys) * scale
        probs = _causal_softmax(scores, cached)
        out[rows] = torch.einsum("htn,nhd->thd", probs, values).to(q.dtype)
    return out


def write_latent(
    latent_pages: Tensor,
    latent: Tensor,
    k_rope: Tensor,
    page_table: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
) -> None:
    """Write the new tokens' compressed latent and rope key into their pages, in place.

    latent_pages: [P, page_size, R + Dr]; latent: [N, R] (after kv_a_layernorm); k_rope: [N, Dr].
    """
    _check_rows(page_table, cached_lens, cu_seqlens, latent.shape[0])
    rank = latent.shape[1]
    for n, page, offset in _new_token_slots(page_table, cached_lens, cu_seqlens, latent_pages.shape[1]):
        latent_pages[page, offset, :rank] = latent[n]
        latent_pages[page, offset, rank:] = k_rope[n]


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
) -> Tensor:
    """MLA over paged latents, computed by expanding every cached latent into per-head keys and values.

    q_nope: [N, H, Dn]; q_rope: [N, H, Dr]; latent: [N, R]; k_rope: [N, Dr] (one rope key shared by
    all heads); latent_pages: [P, page_size, R + Dr]; w_k: [H, Dn, R] and w_v: [H, Dv, R], the two parts
    of kv_b_proj's weight (``weight.view(H, Dn + Dv, R).split([Dn, Dv], dim=1)``).
    Key of head h at position s: ``cat(w_k[h] @ c_s, k_rope_s)``; value: ``w_v[h] @ c_s``.
    scale defaults to (Dn + Dr) ** -0.5. Returns [N, H, Dv] in q_nope's dtype.
    """
    write_latent(latent_pages, latent, k_rope, page_table, cached_lens, cu_seqlens)
    rank = latent.shape[1]
    scale = (q_nope.shape[-1] + q_rope.shape[-1]) ** -0.5 if scale is None else scale
    out = torch.zeros(*q_nope.shape[:2], w_v.shape[1], dtype=q_nope.dtype, device=q_nope.device)
    for rows, cached, pages, offsets in _rows_to_attend(page_table, cached_lens, cu_seqlens, latent_pages.shape[1]):
        cached_latent = latent_pages[pages, offsets].float()  # [n, R + Dr]
        c, rope_keys = cached_latent[:, :rank], cached_latent[:, rank:]
        keys = torch.einsum("nr,hdr->hnd", c, w_k.float())  # [H, n, Dn]
        values = torch.einsum("nr,hdr->hnd", c, w_v.float())  # [H, n, Dv]
        scores = torch.einsum("thd,hnd->htn", q_nope[rows].float(), keys)
        scores = scores + torch.einsum("thd,nd->htn", q_rope[rows].float(), rope_keys)
        probs = _causal_softmax(scores * scale, cached)
        out[rows] = torch.einsum("htn,hnd->thd", probs, values).to(q_nope.dtype)
    return out
