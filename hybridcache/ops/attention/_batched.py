"""Vectorized torch building blocks: group rows, pad them, gather their pages, masked SDPA.

The fast ops gather each group's pages into a padded ``[Bs, L, ...]`` tensor and run one masked
``scaled_dot_product_attention`` per group. Rows with few new tokens (decode, verify) share one group;
each row with many new tokens (prefill) gets its own, so a long prefill never pads a batch of decodes
to its length. On CUDA, decode and verify steps skip all this: ``triton_paged.py`` reads the pages
in place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hybridcache.ops.attention._layout import HostRows, row_pages
from hybridcache.ops.attention._scratch import scratch

# Rows with at most this many new tokens are batched together; longer ones run one row at a time.
BATCH_MAX_NEW = 16


@dataclass(frozen=True)
class RowGroup:
    """Rows attended in one padded call. Tensors are [Bs] int64 on the op's device."""

    rows: Tensor
    starts: Tensor  # first new token of each row in the flat [N] order
    counts: Tensor  # new tokens of each row
    cached: Tensor  # tokens already in pages before this step
    max_new: int
    max_len: int  # max(cached + counts)
    min_len: int  # min(cached + counts): positions below it are valid in every row


def group_rows(cached_lens: Tensor, cu_seqlens: Tensor, batch_max_new: int = BATCH_MAX_NEW,
               host: HostRows | None = None, table_len: int | None = None) -> list[RowGroup]:
    """Split the rows that have new tokens into padded groups: one host sync to read the row lengths
    back, none when `host` gives them. With `host.uniform_new` and no host lengths, one group of every
    row, padded to `table_len` (the positions the page table can hold): no sync, static shapes."""
    cu = cu_seqlens.long()
    starts, counts, cached = cu[:-1], cu[1:] - cu[:-1], cached_lens.long()
    if host is not None and host.cached_lens is None and host.uniform_new and table_len:
        rows = torch.arange(counts.shape[0], device=cu.device)
        return [RowGroup(rows, starts, counts, cached, host.uniform_new, table_len, 0)]
    if host is None or host.cached_lens is None:
        host_counts, host_cached = torch.stack([counts, cached]).tolist()
    else:
        host_counts, host_cached = host.num_new.tolist(), host.cached_lens.tolist()
    short = [b for b, n in enumerate(host_counts) if 0 < n <= batch_max_new]
    members = ([short] if short else []) + [[b] for b, n in enumerate(host_counts) if n > batch_max_new]
    groups = []
    for rows in members:
        # a copy from pageable memory that does not wait for the device (a blocking one synchronises)
        idx = torch.from_numpy(np.array(rows, dtype=np.int64)).to(cu.device, non_blocking=True)
        groups.append(
            RowGroup(
                rows=idx,
                starts=starts.index_select(0, idx),
                counts=counts.index_select(0, idx),
                cached=cached.index_select(0, idx),
                max_new=max(host_counts[b] for b in rows),
                max_len=max(host_counts[b] + host_cached[b] for b in rows),
                min_len=min(host_counts[b] + host_cached[b] for b in rows),
            )
        )
    return groups


def pad_queries(q: Tensor, group: RowGroup) -> tuple[Tensor, Tensor]:
    """Gather a group's new tokens into ``[Bs, max_new, ...]``.

    q: [N, ...]. Returns the padded queries and ``dest [Bs, max_new]``: each entry's index in [N], or N
    for padding (so ``out[dest] = padded`` with an ``[N + 1, ...]`` buffer scatters without a sync).
    Padding entries hold a copy of some real token; their outputs land in the dummy row N.
    """
    n = q.shape[0]
    steps = torch.arange(group.max_new, device=q.device)
    index = group.starts[:, None] + steps
    dest = torch.where(steps < group.counts[:, None], index, n)
    return q[index.clamp(max=n - 1)], dest


def query_positions(group: RowGroup) -> Tensor:
    """Absolute position of each padded query: ``cached + i``, [Bs, max_new]."""
    return group.cached[:, None] + torch.arange(group.max_new, device=group.cached.device)


def gather_pages(pages: Tensor, page_table: Tensor, group: RowGroup, slot: int) -> Tensor:
    """A group's tokens out of the pages, zero past each row's length.

    pages: [P, page_size, ...]; returns [Bs, L, ...] with L = max_len rounded up to whole pages, in
    scratch buffer `slot` (valid until the next gather into that slot).
    Zeroing matters: a stale or never-written page slot may hold NaN, and 0 * NaN poisons the output.
    """
    page_size = pages.shape[1]
    num_pages = -(-group.max_len // page_size)
    ids = row_pages(page_table, group.rows, num_pages).flatten()
    batch, length = group.rows.shape[0], num_pages * page_size
    out = scratch((batch * num_pages, *pages.shape[1:]), pages.dtype, pages.device, slot)
    torch.index_select(pages, 0, ids, out=out)
    out = out.view(batch, length, *pages.shape[2:])
    lengths = group.cached + group.counts
    tail = out[:, group.min_len :]  # only this part can hold positions past some row's end
    past_end = torch.arange(group.min_len, length, device=out.device)[None, :] >= lengths[:, None]
    tail.masked_fill_(past_end.view(batch, length - group.min_len, *[1] * (out.ndim - 2)), 0)
    return out


def masked_attention(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, scale: float) -> Tensor:
    """Causal attention of padded queries over padded keys, GQA folded into the query length.

    q: [Bs, Tq, Hq, Dk]; k: [Bs, L, Hkv, Dk]; v: [Bs, L, Hkv, Dv]; q_pos: [Bs, Tq] absolute positions
    (query i sees keys 0..q_pos[i]). Query head h reads kv head h // (Hq // Hkv).
    Returns [Bs, Tq, Hq, Dv].
    """
    batch, tq, hq, dk = q.shape
    length, hkv, dv = k.shape[1], k.shape[2], v.shape[-1]
    group = hq // hkv
    # Each kv head serves its G query heads as G * Tq rows of one query block: row g * Tq + i.
    q_fold = q.view(batch, tq, hkv, group, dk).permute(0, 2, 3, 1, 4).reshape(batch, hkv, group * tq, dk)
    visible = torch.arange(length, device=q.device)[None, None, :] <= q_pos[:, :, None]  # [Bs, Tq, L]
    mask = visible[:, None, None].expand(batch, 1, group, tq, length).reshape(batch, 1, group * tq, length)
    out = F.scaled_dot_product_attention(q_fold, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale)
    return out.view(batch, hkv, group, tq, dv).permute(0, 3, 1, 2, 4).reshape(batch, tq, hq, dv)


def attend_groups(
    queries: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
    out_tail: tuple[int, ...],
    out_dtype: torch.dtype,
    attend: Callable[[RowGroup, Tensor], Tensor],
    host: HostRows | None = None,
    table_len: int | None = None,
) -> Tensor:
    """Run `attend(group, padded queries [Bs, max_new, ...]) -> [Bs, max_new, *out_tail]` for every group
    of `group_rows` and scatter the results back to the flat order: returns [N, *out_tail] in `out_dtype`.

    queries: [N, ...]. Padding entries of a group land in a dummy row N, dropped at the end (no sync).
    host: the rows' lengths on the host, if known (then nothing is read back).
    """
    out = queries.new_zeros(queries.shape[0] + 1, *out_tail, dtype=out_dtype)
    for group in group_rows(cached_lens, cu_seqlens, host=host, table_len=table_len):
        q_pad, dest = pad_queries(queries, group)
        out[dest.flatten()] = attend(group, q_pad).flatten(0, 1).to(out_dtype)
    return out[:-1]
