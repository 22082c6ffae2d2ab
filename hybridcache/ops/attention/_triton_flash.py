"""What the paged attention kernels (``triton_paged.py`` GQA, ``triton_mla.py`` absorbed MLA) share: the
work split over query blocks and key splits, the online softmax, the result or partial store, and the
merge of key splits.

Work split. A row's new tokens are cut into query blocks of ``BLOCK_T`` tokens; blocks are numbered row
after row and a program finds its row from ``cu_seqlens`` on the device, so the grid is sized from
host-known bounds only: a row of c tokens has ``ceil(c / BLOCK_T) <= c`` blocks, and
``<= c / BLOCK_T + 1``, so ``min(N, N // BLOCK_T + B)`` programs cover every row; the spare ones do
nothing. Each block attends to keys ``[0, kv_len)``; key split s takes its s-th chunk of whole
``BLOCK_N`` tiles. Softmax is online, in fp32, in base 2; with more than one split each writes its
unnormalised partial ``[S, N, H, D]`` and stats ``[S, N, H, 2]`` (running max, sum) and ``_merge_kernel``
combines them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..pdl_triton import pdl_entry, pdl_launch
from ..triton_support import interpreting, num_sms

LOG2E = 1.4426950408889634


@triton.jit
def find_block(pid, cu_ptr, cached_ptr, num_rows, BLOCK_T: tl.constexpr, BLOCK_B: tl.constexpr):
    """Program `pid`'s (row, query block of the row, row's first token, row's new-token count (0 for a
    spare program), row's cached length), read from cu_seqlens [B + 1] and cached_lens [B]."""
    rows = tl.arange(0, BLOCK_B)
    lo = tl.load(cu_ptr + rows, mask=rows < num_rows, other=0)
    hi = tl.load(cu_ptr + rows + 1, mask=rows < num_rows, other=0)
    blocks = (hi - lo + BLOCK_T - 1) // BLOCK_T
    ends = tl.cumsum(blocks, 0)
    row = tl.sum((ends <= pid).to(tl.int32), 0)
    active = row < num_rows
    row = tl.minimum(row, num_rows - 1)
    mine = rows == row  # the row's scalars are picked out of the vectors already loaded
    block = pid - tl.sum(tl.where(mine, ends - blocks, 0), 0)
    start = tl.sum(tl.where(mine, lo, 0), 0)
    count = tl.where(active, tl.sum(tl.where(mine, hi - lo, 0), 0), 0)
    cached = tl.sum(tl.load(cached_ptr + rows, mask=mine, other=0), 0)
    return row, block, start, count, cached


@triton.jit
def key_range(block, count, cached, split,
              BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """Keys [k_lo, k_hi) of split `split` for the query block: its s-th chunk of [0, kv_len)."""
    kv_len = tl.where(count > 0, cached + tl.minimum(count, (block + 1) * BLOCK_T), 0)
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    k_lo = split * chunk
    k_hi = tl.minimum(kv_len, k_lo + chunk)
    return k_lo, k_hi


@triton.jit
def key_pages(table_row, n0, k_hi, table_width, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Positions [n0, n0 + BLOCK_N), which of them are keys, and each one's page (int64, 0 if not a key).
    A position whose page is -1 is no key: a padding row of a graph step (no pages) reads nothing."""
    pos = n0 + tl.arange(0, BLOCK_N)
    col = pos // PAGE_SIZE
    in_k = (pos < k_hi) & (col < table_width)
    page = tl.load(table_row + col, mask=in_k, other=0).to(tl.int64)
    in_k = in_k & (page >= 0)
    return pos, in_k, tl.where(in_k, page, 0)


@triton.jit
def softmax_step(s, pos, in_k, q_pos, m_i, l_i):
    """One online-softmax step over scores s [M, BLOCK_N] (log2 units): masks keys that are not keys or
    lie after the query, returns (p [M, BLOCK_N], alpha [M] to rescale the accumulator by, new max, new sum)."""
    s = tl.where(in_k[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row with nothing visible yet keeps max -inf; shift by 0 so exp2 gives 0, not NaN.
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - shift[:, None])
    alpha = tl.exp2(m_i - shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_i


@triton.jit
def store_rows(acc, m_i, l_i, out_ptr, part_ptr, stat_ptr, token, head, d, valid, d_ok,
               stride_on, stride_oh, split, num_tokens, num_heads,
               HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """The tile's result: normalised into out [N, H, D] with one split; else the unnormalised partial
    into part [S, N, H, D] and (max, sum) into stat [S, N, H, 2] (contiguous)."""
    if NUM_SPLITS == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + token[:, None] * stride_on + head[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=valid[:, None] & d_ok[None, :])
    else:
        flat = (split * num_tokens + token) * num_heads + head
        tl.store(part_ptr + flat[:, None] * HEAD_DIM + d[None, :], acc, mask=valid[:, None] & d_ok[None, :])
        tl.store(stat_ptr + flat * 2, m_i, mask=valid)
        tl.store(stat_ptr + flat * 2 + 1, l_i, mask=valid)


@triton.jit
def _merge_kernel(
    part_ptr, stat_ptr, out_ptr, stride_on, stride_oh, num_tokens, num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, PDL: tl.constexpr,
):
    """One program per (token, query head): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s."""
    pdl_entry(PDL)
    n, h = tl.program_id(0), tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    m_all = tl.full([BLOCK_D], float("-inf"), tl.float32)  # one lane is enough; a vector keeps types simple
    for s in range(NUM_SPLITS):
        m_all = tl.maximum(m_all, tl.load(stat_ptr + ((s * num_tokens + n) * num_heads + h) * 2))
    shift = tl.where(m_all == float("-inf"), 0.0, m_all)
    num = tl.zeros([BLOCK_D], tl.float32)
    den = tl.zeros([BLOCK_D], tl.float32)
    for s in range(NUM_SPLITS):
        flat = (s * num_tokens + n) * num_heads + h
        w = tl.exp2(tl.load(stat_ptr + flat * 2) - shift)
        num += w * tl.load(part_ptr + flat * HEAD_DIM + d, mask=d_ok, other=0.0)
        den += w * tl.load(stat_ptr + flat * 2 + 1)
    o = num / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + n.to(tl.int64) * stride_on + h * stride_oh + d, o.to(out_ptr.dtype.element_ty), mask=d_ok)


def plan_grid(
    num_tokens: int, num_rows: int, width: int, page_size: int, heads_per_tile: int, max_tile_rows: int,
    programs_per_block: int, device: torch.device, block_t: int | None, num_splits: int | None,
    min_keys: int, max_splits: int | None = None,
) -> tuple[int, int, int]:
    """(block_t, query-block programs, key splits). block_t defaults to the tokens per row on average,
    rounded up to a power of two, at most 16, with ``block_t * heads_per_tile <= max_tile_rows``;
    num_splits to enough programs (``programs_per_block`` per query block and split) for two per SM,
    each split at least ``min_keys`` keys of the table, and at most ``max_splits``."""
    if block_t is None:
        block_t = triton.next_power_of_2(-(-num_tokens // num_rows))
        fit = max_tile_rows // heads_per_tile if heads_per_tile <= max_tile_rows else 1
        block_t = max(1, min(block_t, 16, fit))
    grid_blocks = min(num_tokens, num_tokens // block_t + num_rows)
    if num_splits is None:
        want = -(-2 * num_sms(device) // (grid_blocks * programs_per_block))
        num_splits = max(1, min(want, -(-width * page_size // min_keys), max_splits or want))
    return block_t, grid_blocks, num_splits


def split_buffers(num_splits: int, out: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 partials [S, N, H, D] and stats [S, N, H, 2] for out [N, H, D]; `out` twice (unused) with
    one split."""
    if num_splits == 1:
        return out, out
    num_tokens, heads, dim = out.shape
    part = torch.empty(num_splits, num_tokens, heads, dim, dtype=torch.float32, device=out.device)
    stat = torch.empty(num_splits, num_tokens, heads, 2, dtype=torch.float32, device=out.device)
    return part, stat


def merge_splits(part: Tensor, stat: Tensor, out: Tensor) -> None:
    """Normalised out [N, H, D] from the key splits' partials; nothing to do with one split."""
    if part is out:
        return
    num_splits, num_tokens, heads, dim = part.shape
    _merge_kernel[(num_tokens, heads)](
        part, stat, out, out.stride(0), out.stride(1), num_tokens, heads,
        HEAD_DIM=dim, BLOCK_D=triton.next_power_of_2(dim), NUM_SPLITS=num_splits, **pdl_launch(part),
    )


def dot_modes(dtype: torch.dtype) -> dict[str, object]:
    """The kernels' PRECISION and UPCAST: ieee dots for fp32 pages and in the interpreter (tf32 else);
    upcast bf16/fp16 tiles in the interpreter, whose dot cannot take them."""
    return {"PRECISION": "ieee" if dtype == torch.float32 or interpreting() else "tf32",
            "UPCAST": interpreting() and dtype != torch.float32}
