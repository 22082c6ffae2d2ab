"""MLA decode / verify in the absorbed form as a Triton kernel: latent pages read in place, no gather.

Every query head is a query over the latent itself (``mla.py``, "absorbed"): ``q_lat [N, H, R]``
(``w_k[h]^T q_nope``, computed by the caller) and ``q_rope [N, H, Dr]`` score against the one key
``pages[slot] = cat(c, k_rope)`` of width R + Dr shared by all H heads, and the value is ``c``, the key's
first R columns. Returns ``o_lat [N, H, R]``; the caller projects it with ``w_v``.

Work split as in ``triton_paged.py`` (one kv head of group H): a row's new tokens are cut into blocks of
``BLOCK_T`` tokens; one program holds the ``BLOCK_T * H`` query rows of a block as one tile, so each
latent is read once per block for all heads; blocks find their row from ``cu_seqlens`` on the device, and
``min(N, N // BLOCK_T + B)`` programs cover every row. Keys are read ``BLOCK_N`` positions at a time, each
position's page looked up in the table. The score is two dots (latent part, rope part), so R and Dr
need not be powers of two (masked tiles). Online softmax in fp32, base 2; with key splits (flash
decoding, for few rows over long contexts) ``_triton_flash._merge_kernel`` merges the partials.
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

MAX_TILE_ROWS = 32  # BLOCK_T * H query rows per program: the fp32 accumulator is [rows, R]
# Keys a loop step, and the key splits. A step's chain (its keys' loads, the score dot over R + Dr = 576
# columns, the softmax, the value dot) costs about 3 us whatever the batch, so fewer, wider steps and more
# splits. Timed on an H100 (benchmarks/tune_decode_attention.py, kimi_linear 1B, 8 warps, us at batch 1 / 16):
# 160 keys: 16 a step and one split 24.3 / 25.3; 64 a step 15.6 / 15.7; 64 a step and 8 splits 11.6 / 13.3,
# 32 a step and 8 splits 10.1 / 11.4. 1,024 keys: 64 a step and 4 splits (the shared rule's 256 keys a split)
# 21.3 / 22.3, 8 splits 15.2 / 17.2. Eight splits were the most timed.
BLOCK_N = 64
MIN_KEYS_PER_SPLIT = 16
MAX_SPLITS = 8


@triton.jit
def _mla_kernel(
    ql_ptr, qr_ptr, pages_ptr, table_ptr, cached_ptr, cu_ptr, out_ptr, part_ptr, stat_ptr,
    scale_log2,
    stride_ln, stride_lh, stride_rn, stride_rh,
    stride_pp, stride_ps,
    stride_tb,
    stride_on, stride_oh,
    num_rows, table_width, num_tokens,
    PAGE_SIZE: tl.constexpr, HEADS: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_DR: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    pid, split = tl.program_id(0), tl.program_id(1)

    row, block, start, count, cached = find_block(pid, cu_ptr, cached_ptr, num_rows, BLOCK_T, BLOCK_B)

    # Tile row m is query token m // HEADS of the block, head m % HEADS.
    m = tl.arange(0, BLOCK_M)
    tok = block * BLOCK_T + m // HEADS
    head = m % HEADS
    valid = (m < BLOCK_T * HEADS) & (tok < count)
    q_pos = cached + tok
    r = tl.arange(0, BLOCK_R)
    r_ok = r < RANK
    e = tl.arange(0, BLOCK_DR)
    e_ok = e < ROPE
    token = (start + tok).to(tl.int64)
    q_lat = tl.load(ql_ptr + token[:, None] * stride_ln + head[:, None] * stride_lh + r[None, :],
                    mask=valid[:, None] & r_ok[None, :], other=0.0)
    q_rope = tl.load(qr_ptr + token[:, None] * stride_rn + head[:, None] * stride_rh + e[None, :],
                     mask=valid[:, None] & e_ok[None, :], other=0.0)
    if UPCAST:  # the interpreter's dot cannot take bf16
        q_lat, q_rope = q_lat.to(tl.float32), q_rope.to(tl.float32)

    k_lo, k_hi = key_range(block, count, cached, split, BLOCK_T, BLOCK_N, NUM_SPLITS)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    table_row = table_ptr + row.to(tl.int64) * stride_tb
    for n0 in range(k_lo, k_hi, BLOCK_N):
        pos, in_k, page = key_pages(table_row, n0, k_hi, table_width, PAGE_SIZE, BLOCK_N)
        slot = pages_ptr + page * stride_pp + (pos % PAGE_SIZE) * stride_ps
        c = tl.load(slot[:, None] + r[None, :], mask=in_k[:, None] & r_ok[None, :], other=0.0)
        k_rope = tl.load(slot[:, None] + RANK + e[None, :], mask=in_k[:, None] & e_ok[None, :], other=0.0)
        if UPCAST:
            c, k_rope = c.to(tl.float32), k_rope.to(tl.float32)
        s = tl.dot(q_lat, tl.trans(c), input_precision=PRECISION)
        s = tl.dot(q_rope, tl.trans(k_rope), acc=s, input_precision=PRECISION) * scale_log2
        p, alpha, m_i, l_i = softmax_step(s, pos, in_k, q_pos, m_i, l_i)
        p_c = p.to(pages_ptr.dtype.element_ty).to(c.dtype)  # probabilities in the pages' dtype, as SDPA
        acc = acc * alpha[:, None] + tl.dot(p_c, c, input_precision=PRECISION)

    store_rows(acc, m_i, l_i, out_ptr, part_ptr, stat_ptr, token, head, r, valid, r_ok,
               stride_on, stride_oh, split, num_tokens, HEADS, RANK, NUM_SPLITS)


def mla_attend_triton(
    q_lat: Tensor,
    q_rope: Tensor,
    latent_pages: Tensor,
    page_table: Tensor,
    cached_lens: Tensor,
    cu_seqlens: Tensor,
    scale: float,
    out: Tensor | None = None,
    num_splits: int | None = None,
    block_t: int | None = None,
    block_n: int = BLOCK_N,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> Tensor:
    """Absorbed MLA of the new tokens over latent pages that already hold them (read only).

    q_lat: [N, H, R]; q_rope: [N, H, Dr] (any strides with unit stride in the last dim);
    latent_pages: [P, page_size, R + Dr]; page_table: [B, W] int; cached_lens: [B]; cu_seqlens: [B + 1].
    Returns o_lat [N, H, R] in the pages' dtype (into `out`, e.g. an [H, N, R] buffer's transpose, if
    given). ``num_splits`` and ``block_t`` (a power of two) default to a choice from the shapes, ``block_n``
    (keys a loop step, a power of two >= 16) to BLOCK_N, ``num_warps`` to 8 from a rank of 256 and
    ``num_stages`` (the key loop's software pipelining) to Triton's; `benchmarks/tune_decode_attention.py`
    sweeps them. None changes the result beyond rounding.
    """
    num_tokens, heads, rank = q_lat.shape
    rope = q_rope.shape[-1]
    num_rows, width = page_table.shape
    page_size = latent_pages.shape[1]
    if out is None:
        out = torch.empty(num_tokens, heads, rank, dtype=latent_pages.dtype, device=q_lat.device)
    if num_tokens == 0 or num_rows == 0:
        return out.zero_()
    q_lat = q_lat if q_lat.stride(-1) == 1 else q_lat.contiguous()
    q_rope = q_rope if q_rope.stride(-1) == 1 else q_rope.contiguous()
    if latent_pages.stride(-1) != 1:
        raise ValueError("latent pages need unit stride in their last dim")

    block_t, grid_blocks, num_splits = plan_grid(
        num_tokens, num_rows, width, page_size, heads, MAX_TILE_ROWS, 1, q_lat.device, block_t, num_splits,
        MIN_KEYS_PER_SPLIT, MAX_SPLITS)
    part, stat = split_buffers(num_splits, out)
    _mla_kernel[(grid_blocks, num_splits)](
        q_lat, q_rope, latent_pages, page_table, cached_lens, cu_seqlens, out, part, stat,
        scale * LOG2E,
        q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1),
        latent_pages.stride(0), latent_pages.stride(1),
        page_table.stride(0),
        out.stride(0), out.stride(1),
        num_rows, width, num_tokens,
        PAGE_SIZE=page_size, HEADS=heads, RANK=rank, ROPE=rope,
        BLOCK_R=max(16, triton.next_power_of_2(rank)), BLOCK_DR=max(16, triton.next_power_of_2(rope)),
        BLOCK_T=block_t, BLOCK_M=max(16, triton.next_power_of_2(block_t * heads)), BLOCK_N=block_n,
        BLOCK_B=max(16, triton.next_power_of_2(num_rows)), NUM_SPLITS=num_splits, **dot_modes(latent_pages.dtype),
        num_warps=num_warps or (8 if rank >= 256 else 4),  # the [rows, R] fp32 accumulator over more threads
        **({} if num_stages is None else {"num_stages": num_stages}), **pdl_launch(q_lat),
    )
    merge_splits(part, stat, out)
    return out
