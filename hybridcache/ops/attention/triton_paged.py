"""Paged GQA attention as a Triton kernel: reads the pages in place, no gather, no host sync.

Same contract as ``paged.attend_kv_pages``: ``q [N, Hq, D]``; ``kv [P, 2, page_size, Hkv, D]``; row ``b``
owns the new tokens ``[cu_seqlens[b], cu_seqlens[b + 1])`` at positions ``cached_lens[b] + i`` and
its pages already hold positions ``[0, cached_lens[b] + new tokens)``.

Work split (``_triton_flash.py``). A row's new tokens are cut into query blocks of ``BLOCK_T`` tokens;
one program takes one (query block, kv head, key split) and holds the ``BLOCK_T * G`` query rows of the
kv head's G query heads as one tile (GQA reads each key once per kv head). Keys are read ``BLOCK_N``
positions at a time, each position's page looked up in the page table (any page size works). Softmax is
online, in fp32, in base 2. With more than one key split (flash-decoding, for few rows over long
contexts) each split writes its unnormalised partial and a second kernel merges them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._triton_flash import (
    LOG2E, dot_modes, find_block, key_pages, key_range, merge_splits, plan_grid, softmax_step, split_buffers,
    store_rows,
)
from ..pdl_triton import pdl_entry, pdl_launch

MAX_TILE_ROWS = 64  # BLOCK_T * G query rows per program, bounded to keep the fp32 accumulator in registers
# The key loop's pipeline depth for one token a row at head dims up to 128: two stages of keys and values in
# shared memory let more programs share an SM than Triton's three (H200, nemotron_h 1B's 32 / 8 heads of 128,
# 1,024 keys, us at batch 16 / 64 / 256: 25.5 / 69.2 / 257.4 against 25.6 / 88.9 / 282.9). At 256 (qwen3_next
# 1B) one program fills an SM's shared memory either way, and Triton's depth stays (17.8 / 50.9 / 139.1 against
# 18.8 / 50.6 / 140.0 at two stages).
DECODE_STAGES, DECODE_STAGES_MAX_DIM = 2, 128
# Keys a split at least (`plan_grid`): at batch 1 over a short context that is one split, so qwen3_next 1B's decode
# attention runs 2 programs (its 2 kv heads) for the whole GPU: 12.0 us a launch under Nsight Compute (H100,
# benchmarks/gpu/bs1_kernels.sh, 2026-12-07), 8.1 us beyond the profile's floor and its bytes. At 32 (five splits and
# a merge launch over its ~160 keys) qwen3_next's batch-1 graph step ran 1,139 tok/s (replay 0.84 ms) against
# 1,120-1,128 (0.85 ms) for three runs at 256 in the same call (H100, gemv_steps.sh, session 51): within what runs
# differ by, and nemotron_h (8 kv heads) not timed, so 256 stays. MLA's kernel takes 16 (triton_mla.py).
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
    NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    pid, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    num_heads = GROUP * tl.num_programs(1)
    row, block, start, count, cached = find_block(pid, cu_ptr, cached_ptr, num_rows, BLOCK_T, BLOCK_B)

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

    k_lo, k_hi = key_range(block, count, cached, split, BLOCK_T, BLOCK_N, NUM_SPLITS)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = table_ptr + row.to(tl.int64) * stride_tb
    for n0 in range(k_lo, k_hi, BLOCK_N):
        pos, in_k, page = key_pages(table_row, n0, k_hi, table_width, PAGE_SIZE, BLOCK_N)
        slot = page * stride_kp + (pos % PAGE_SIZE) * stride_ks + kv_head * stride_kh
        kv_mask = in_k[:, None] & d_ok[None, :]
        k = tl.load(kv_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(kv_ptr + stride_kkv + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:  # the interpreter's dot cannot take bf16; same roundings below, fp32 products
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q.to(kv_ptr.dtype.element_ty).to(k.dtype), tl.trans(k), input_precision=PRECISION) * scale_log2
        p, alpha, m_i, l_i = softmax_step(s, pos, in_k, q_pos, m_i, l_i)
        p_kv = p.to(kv_ptr.dtype.element_ty).to(v.dtype)  # probabilities in the pages' dtype, as SDPA
        acc = acc * alpha[:, None] + tl.dot(p_kv, v, input_precision=PRECISION)

    store_rows(acc, m_i, l_i, out_ptr, part_ptr, stat_ptr, token, head, d, valid, d_ok,
               stride_on, stride_oh, split, num_tokens, num_heads, HEAD_DIM, NUM_SPLITS)


def attend_kv_pages_triton(
    q: Tensor,
    kv: Tensor,
    page_table: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
    scale: float | None = None,
    num_splits: int | None = None,
    block_t: int | None = None,
    block_n: int | None = None,
) -> Tensor:
    """Attention of the new tokens over pages that already hold them (read only), one Triton launch
    (two with key splits). Same arguments and result as ``paged.attend_kv_pages``.

    q: [N, Hq, D]; kv: [P, 2, page_size, Hkv, D]; page_table: [B, W] int; cached_lens: [B];
    cu_seqlens: [B + 1]. Returns [N, Hq, D] in q's dtype. ``num_splits`` (key splits per query block),
    ``block_t`` (query tokens per block, a power of two) and ``block_n`` (keys a loop step, a power of two
    >= 16) default to a choice from the shapes; none changes the result beyond rounding.
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

    block_t, grid_blocks, num_splits = plan_grid(
        num_tokens, num_rows, width, page_size, group, MAX_TILE_ROWS, num_kv_heads, q.device, block_t, num_splits,
        MIN_KEYS_PER_SPLIT)
    block_n = block_n or (64 if page_size * width >= 64 else 16)
    decode = block_t == 1 and head_dim <= DECODE_STAGES_MAX_DIM
    part, stat = split_buffers(num_splits, out)
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
        BLOCK_B=max(16, triton.next_power_of_2(num_rows)), NUM_SPLITS=num_splits, **dot_modes(kv.dtype),
        **pdl_launch(q), **({"num_stages": DECODE_STAGES} if decode else {}),
    )
    merge_splits(part, stat, out)
    return out
