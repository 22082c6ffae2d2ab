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
decoding, for few rows over long contexts) ``triton_paged._merge_kernel`` merges the partials.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..triton_support import interpreting, num_sms
from .triton_paged import LOG2E, MIN_KEYS_PER_SPLIT, _merge_kernel

MAX_TILE_ROWS = 32  # BLOCK_T * H query rows per program: the fp32 accumulator is [rows, R]


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
    NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    pid, split = tl.program_id(0), tl.program_id(1)

    # Which row and which of its query blocks: blocks are numbered row after row.
    rows = tl.arange(0, BLOCK_B)
    lo = tl.load(cu_ptr + rows, mask=rows < num_rows, other=0)
    hi = tl.load(cu_ptr + rows + 1, mask=rows < num_rows, other=0)
    blocks = (hi - lo + BLOCK_T - 1) // BLOCK_T
    ends = tl.cumsum(blocks, 0)
    row = tl.sum((ends <= pid).to(tl.int32), 0)
    active = row < num_rows
    row = tl.minimum(row, num_rows - 1)
    mine = rows == row
    block = pid - tl.sum(tl.where(mine, ends - blocks, 0), 0)
    start = tl.sum(tl.where(mine, lo, 0), 0)
    count = tl.where(active, tl.sum(tl.where(mine, hi - lo, 0), 0), 0)  # a spare program has no tokens
    cached = tl.sum(tl.load(cached_ptr + rows, mask=mine, other=0), 0)

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

    kv_len = tl.where(count > 0, cached + tl.minimum(count, (block + 1) * BLOCK_T), 0)
    chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    k_lo = split * chunk
    k_hi = tl.minimum(kv_len, k_lo + chunk)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    table_row = table_ptr + row.to(tl.int64) * stride_tb
    for n0 in range(k_lo, k_hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        col = pos // PAGE_SIZE
        in_k = (pos < k_hi) & (col < table_width)
        page = tl.load(table_row + col, mask=in_k, other=0).to(tl.int64)
        slot = pages_ptr + page * stride_pp + (pos % PAGE_SIZE) * stride_ps
        c = tl.load(slot[:, None] + r[None, :], mask=in_k[:, None] & r_ok[None, :], other=0.0)
        k_rope = tl.load(slot[:, None] + RANK + e[None, :], mask=in_k[:, None] & e_ok[None, :], other=0.0)
        if UPCAST:
            c, k_rope = c.to(tl.float32), k_rope.to(tl.float32)
        s = tl.dot(q_lat, tl.trans(c), input_precision=PRECISION)
        s = tl.dot(q_rope, tl.trans(k_rope), acc=s, input_precision=PRECISION) * scale_log2
        s = tl.where(in_k[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing visible yet: exp2 gives 0, not NaN
        p = tl.exp2(s - shift[:, None])
        alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        p_c = p.to(pages_ptr.dtype.element_ty).to(c.dtype)  # probabilities in the pages' dtype, as SDPA
        acc = acc * alpha[:, None] + tl.dot(p_c, c, input_precision=PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + token[:, None] * stride_on + head[:, None] * stride_oh + r[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=valid[:, None] & r_ok[None, :])
    else:
        # Partials [S, N, H, R] and stats [S, N, H, 2] (running max, sum), contiguous.
        flat = (split * num_tokens + token) * HEADS + head
        tl.store(part_ptr + flat[:, None] * RANK + r[None, :], acc, mask=valid[:, None] & r_ok[None, :])
        tl.store(stat_ptr + flat * 2, m_i, mask=valid)
        tl.store(stat_ptr + flat * 2 + 1, l_i, mask=valid)


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
) -> Tensor:
    """Absorbed MLA of the new tokens over latent pages that already hold them (read only).

    q_lat: [N, H, R]; q_rope: [N, H, Dr] (any strides with unit stride in the last dim);
    latent_pages: [P, page_size, R + Dr]; page_table: [B, W] int; cached_lens: [B]; cu_seqlens: [B + 1].
    Returns o_lat [N, H, R] in the pages' dtype (into `out`, e.g. an [H, N, R] buffer's transpose, if
    given). ``num_splits`` and ``block_t`` (a power of two) default to a choice from the shapes; neither
    changes the result beyond rounding.
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

    if block_t is None:  # tokens per row on average, rounded up to a power of two, within the tile
        block_t = triton.next_power_of_2(-(-num_tokens // num_rows))
        block_t = max(1, min(block_t, 16, MAX_TILE_ROWS // heads if heads <= MAX_TILE_ROWS else 1))
    grid_blocks = min(num_tokens, num_tokens // block_t + num_rows)
    if num_splits is None:
        want = -(-2 * num_sms(q_lat.device) // grid_blocks)
        num_splits = max(1, min(want, -(-width * page_size // MIN_KEYS_PER_SPLIT)))
    if num_splits > 1:
        part = torch.empty(num_splits, num_tokens, heads, rank, dtype=torch.float32, device=q_lat.device)
        stat = torch.empty(num_splits, num_tokens, heads, 2, dtype=torch.float32, device=q_lat.device)
    else:
        part = stat = out  # unused
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
        BLOCK_T=block_t, BLOCK_M=max(16, triton.next_power_of_2(block_t * heads)), BLOCK_N=16,
        BLOCK_B=max(16, triton.next_power_of_2(num_rows)), NUM_SPLITS=num_splits,
        PRECISION="ieee" if latent_pages.dtype == torch.float32 or interpreting() else "tf32",
        UPCAST=interpreting() and latent_pages.dtype != torch.float32,
        num_warps=8 if rank >= 256 else 4,  # the [rows, R] fp32 accumulator over more threads
    )
    if num_splits > 1:
        _merge_kernel[(num_tokens, heads)](
            part, stat, out, out.stride(0), out.stride(1), num_tokens, heads,
            HEAD_DIM=rank, BLOCK_D=triton.next_power_of_2(rank), NUM_SPLITS=num_splits,
        )
    return out
