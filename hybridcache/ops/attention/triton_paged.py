"""Paged GQA attention as a Triton kernel: reads the pages in place, no gather, no host sync.

Same contract as ``paged.attend_kv_pages``: ``q [N, Hq, D]``; ``kv [P, 2, page_size, Hkv, D]``; row ``b``
owns the new tokens ``[cu_seqlens[b], cu_seqlens[b + 1])`` at positions ``cached_lens[b] + i`` and
its pages already hold positions ``[0, cached_lens[b] + new tokens)``.

Work split. A row's new tokens are cut into query blocks of ``BLOCK_T`` tokens; one program takes one
(query block, kv head, key split) and holds the ``BLOCK_T * G`` query rows of the kv head's G query
heads as one tile (GQA reads each key once per kv head). Programs find their row from ``cu_seqlens``
on the device, so the grid is sized from host-known bounds only: a row of c tokens has
``ceil(c / BLOCK_T) <= c`` blocks, and ``<= c / BLOCK_T + 1``, so ``min(N, N // BLOCK_T + B)`` programs
cover every row; the spare ones do nothing. Keys are read ``BLOCK_N`` positions at a time, each
position's page looked up in the page table (any page size works). Softmax is online, in fp32, in
base 2. With more than one key split (flash-decoding, for few rows over long contexts) each split
writes its unnormalised partial and a second kernel merges them.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..triton_support import num_sms

LOG2E = 1.4426950408889634
MAX_TILE_ROWS = 64  # BLOCK_T * G query rows per program, bounded to keep the fp32 accumulator in registers
MIN_KEYS_PER_SPLIT = 256


@triton.jit
def _attend_kernel(
    q_ptr, kv_ptr, table_ptr, cached_ptr, cu_ptr, out_ptr, part_ptr, stat_ptr,
    scale_log2,
    stride_qn, stride_qh,
    stride_kp, stride_kkv, stride_ks, stride_kh,
    stride_tb,
    stride_on, stride_oh,
    num_rows, table_width, num_tokens,
    PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    pid, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    num_heads = GROUP * tl.num_programs(1)

    # Which row and which of its query blocks: blocks are numbered row after row.
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
    count = tl.where(active, tl.sum(tl.where(mine, hi - lo, 0), 0), 0)  # a spare program has no tokens
    cached = tl.sum(tl.load(cached_ptr + rows, mask=mine, other=0), 0)

    # Tile row m is query token m // GROUP of the block, query head kv_head * GROUP + m % GROUP.
    m = tl.arange(0, BLOCK_M)
    tok = block * BLOCK_T + m // GROUP
    head = kv_head * GROUP + m % GROUP
    valid = (m < BLOCK_T * GROUP) & (tok < count)
    q_pos = cached + tok
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    token = (start + tok).to(tl.int64)
    q = tl.load(q_ptr + token[:, None] * stride_qn + head[:, None] * stride_qh + d[None, :],
                mask=valid[:, None] & d_ok[None, :], other=0.0)

    # Keys [0, kv_len) serve this block; split s takes its s-th chunk, whole BLOCK_N tiles.
    kv_len = tl.where(count > 0, cached + tl.minimum(count, (block + 1) * BLOCK_T), 0)
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    k_lo = split * chunk
    k_hi = tl.minimum(kv_len, k_lo + chunk)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = table_ptr + row.to(tl.int64) * stride_tb
    for n0 in range(k_lo, k_hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        col = pos // PAGE_SIZE
        in_k = (pos < k_hi) & (col < table_width)
        page = tl.load(table_row + col, mask=in_k, other=0).to(tl.int64)
        slot = page * stride_kp + (pos % PAGE_SIZE) * stride_ks + kv_head * stride_kh
        kv_mask = in_k[:, None] & d_ok[None, :]
        k = tl.load(kv_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(kv_ptr + stride_kkv + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:  # the interpreter's dot cannot take bf16; same roundings below, fp32 products
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q.to(kv_ptr.dtype.element_ty).to(k.dtype), tl.trans(k), input_precision=PRECISION) * scale_log2
        s = tl.where(in_k[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with nothing visible yet keeps max -inf; shift by 0 so exp2 gives 0, not NaN.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - shift[:, None])
        alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        p_kv = p.to(kv_ptr.dtype.element_ty).to(v.dtype)  # probabilities in the pages' dtype, as SDPA
        acc = acc * alpha[:, None] + tl.dot(p_kv, v, input_precision=PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + token[:, None] * stride_on + head[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=valid[:, None] & d_ok[None, :])
    else:
        # Partials [S, N, Hq, D] and stats [S, N, Hq, 2] (running max, sum), contiguous.
        flat = (split * num_tokens + token) * num_heads + head
        tl.store(part_ptr + flat[:, None] * HEAD_DIM + d[None, :], acc, mask=valid[:, None] & d_ok[None, :])
        tl.store(stat_ptr + flat * 2, m_i, mask=valid)
        tl.store(stat_ptr + flat * 2 + 1, l_i, mask=valid)


@triton.jit
def _merge_kernel(
    part_ptr, stat_ptr, out_ptr, stride_on, stride_oh, num_tokens, num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    """One program per (token, query head): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s."""
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



def attend_kv_pages_triton(
    q: Tensor,
    kv: Tensor,
    page_table: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
    scale: float | None = None,
    num_splits: int | None = None,
    block_t: int | None = None,
) -> Tensor:
    """Attention of the new tokens over pages that already hold them (read only), one Triton launch
    (two with key splits). Same arguments and result as ``paged.attend_kv_pages``.

    q: [N, Hq, D]; kv: [P, 2, page_size, Hkv, D]; page_table: [B, W] int; cached_lens: [B];
    cu_seqlens: [B + 1]. Returns [N, Hq, D] in q's dtype. ``num_splits`` (key splits per query block)
    and ``block_t`` (query tokens per block, a power of two) default to a choice from the shapes;
    neither changes the result beyond rounding.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_rows, width = page_table.shape
    page_size, num_kv_heads = kv.shape[2], kv.shape[3]
    group = num_heads // num_kv_heads
    scale = head_dim ** -0.5 if scale is None else scale
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_rows == 0:
        return out.zero_()
    q = q if q.stride(-1) == 1 else q.contiguous()
    kv = kv if kv.stride(-1) == 1 else kv.contiguous()
    cached_lens, cu_seqlens, page_table = cached_lens.int(), cu_seqlens.int(), page_table.int()

    if block_t is None:  # tokens per row on average, rounded up to a power of two
        block_t = triton.next_power_of_2(-(-num_tokens // num_rows))
        block_t = max(1, min(block_t, 16, MAX_TILE_ROWS // group if group <= MAX_TILE_ROWS else 1))
    grid_blocks = min(num_tokens, num_tokens // block_t + num_rows)
    if num_splits is None:
        want = -(-2 * num_sms(q.device) // (grid_blocks * num_kv_heads))
        num_splits = max(1, min(want, -(-width * page_size // MIN_KEYS_PER_SPLIT)))
    block_n = 64 if page_size * width >= 64 else 16
    if num_splits > 1:
        part = torch.empty(num_splits, num_tokens, num_heads, head_dim, dtype=torch.float32, device=q.device)
        stat = torch.empty(num_splits, num_tokens, num_heads, 2, dtype=torch.float32, device=q.device)
    else:
        part = stat = out  # unused
    _attend_kernel[(grid_blocks, num_kv_heads, num_splits)](
        q, kv, page_table, cached_lens, cu_seqlens, out, part, stat,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3),
        page_table.stride(0),
        out.stride(0), out.stride(1),
        num_rows, width, num_tokens,
        PAGE_SIZE=page_size, GROUP=group, HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_T=block_t, BLOCK_M=max(16, triton.next_power_of_2(block_t * group)), BLOCK_N=block_n,
        BLOCK_B=max(16, triton.next_power_of_2(num_rows)), NUM_SPLITS=num_splits,
        PRECISION="ieee" if kv.dtype == torch.float32 or interpreting() else "tf32",
        UPCAST=interpreting() and kv.dtype != torch.float32,
    )
    if num_splits > 1:
        _merge_kernel[(num_tokens, num_heads)](
            part, stat, out, out.stride(0), out.stride(1), num_tokens, num_heads,
            HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), NUM_SPLITS=num_splits,
        )
    return out


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"
