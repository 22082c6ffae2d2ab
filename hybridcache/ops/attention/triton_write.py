"""New tokens into their pages as one Triton launch: GQA keys and values, or MLA latents and rope keys.

Each token's two parts ``a [N, Wa]`` and ``b [N, Wb]`` go to its slot of a page: ``a`` at the slot's start,
``b`` ``b_offset`` elements later (GQA: the value plane, ``kv.stride(1)``; MLA: column R). One program per
token finds its row from ``cu_seqlens`` on the device (no host sync, graph-capturable), its position
``cached_lens[row] + n - cu_seqlens[row]`` and its page from the table. A token with no page (-1, or a
column past the table) writes nothing: the callers take this path only for a table checked on the host
(`HostRows.pages_checked`), so that case cannot arise; unchecked calls go to the torch path, which raises
PageTableError.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..pdl_triton import pdl_entry, pdl_launch

MAX_BLOCK = 1024  # elements a program moves per loop step


@triton.jit
def _write_pair_kernel(
    a_ptr, b_ptr, dst_ptr, table_ptr, cached_ptr, cu_ptr,
    stride_a, stride_b, stride_dp, stride_ds, b_offset, stride_tb, num_rows, table_width,
    WIDTH_A: tl.constexpr, WIDTH_B: tl.constexpr, BLOCK: tl.constexpr, BLOCK_B: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PDL: tl.constexpr,
):
    pdl_entry(PDL)
    n = tl.program_id(0)
    rows = tl.arange(0, BLOCK_B)
    ends = tl.load(cu_ptr + rows + 1, mask=rows < num_rows, other=0)
    row = tl.minimum(tl.sum(((ends <= n) & (rows < num_rows)).to(tl.int32), 0), num_rows - 1)
    pos = tl.load(cached_ptr + row) + n - tl.load(cu_ptr + row)
    col = pos // PAGE_SIZE
    page = tl.load(table_ptr + row.to(tl.int64) * stride_tb + col, mask=col < table_width, other=-1)
    has_page = page >= 0
    dst = dst_ptr + page.to(tl.int64) * stride_dp + (pos % PAGE_SIZE) * stride_ds
    src_a = a_ptr + n.to(tl.int64) * stride_a
    src_b = b_ptr + n.to(tl.int64) * stride_b
    i = tl.arange(0, BLOCK)
    for i0 in range(0, WIDTH_A, BLOCK):
        ok = (i0 + i < WIDTH_A) & has_page
        x = tl.load(src_a + i0 + i, mask=ok)
        tl.store(dst + i0 + i, x, mask=ok)
    for i0 in range(0, WIDTH_B, BLOCK):
        ok = (i0 + i < WIDTH_B) & has_page
        x = tl.load(src_b + i0 + i, mask=ok)
        tl.store(dst + b_offset + i0 + i, x, mask=ok)


def _rows_flat(x: Tensor) -> Tensor:
    """[N, ...] -> [N, W] with unit stride inside a token (a view when the layout allows, else a copy)."""
    flat = x.flatten(1) if x.ndim > 2 else x
    return flat if flat.stride(-1) == 1 or flat.shape[1] <= 1 else flat.contiguous()


def write_pair_triton(pages: Tensor, a: Tensor, b: Tensor, b_offset: int, page_table: Tensor, cached_lens: Tensor,
                      cu_seqlens: Tensor) -> None:
    """Write ``a [N, ...]`` and ``b [N, ...]`` (flattened per token) into each token's slot, in place.

    pages: [P, page_size, *slot] with the slot's elements at unit stride where a and b land (the caller
    checks); ``a`` fills the slot's first ``a[0].numel()`` elements, ``b`` starts at ``b_offset``.
    page_table: [B, W] int; cached_lens: [B]; cu_seqlens: [B + 1].
    """
    num_tokens, num_rows = a.shape[0], page_table.shape[0]
    if num_tokens == 0 or num_rows == 0:
        return
    # Torch rounds a differing dtype (no-op, no launch, when the model's dtype is the pool's): the
    # interpreter's fp32 -> bf16 cast truncates where torch and the GPU round to nearest even.
    a, b = _rows_flat(a.to(pages.dtype)), _rows_flat(b.to(pages.dtype))
    width = max(a.shape[1], b.shape[1])
    _write_pair_kernel[(num_tokens,)](
        a, b, pages, page_table, cached_lens, cu_seqlens,
        a.stride(0), b.stride(0), pages.stride(0), pages.stride(1), b_offset, page_table.stride(0),
        num_rows, page_table.shape[1],
        WIDTH_A=a.shape[1], WIDTH_B=b.shape[1], BLOCK=min(MAX_BLOCK, triton.next_power_of_2(width)),
        BLOCK_B=max(16, triton.next_power_of_2(num_rows)), PAGE_SIZE=pages.shape[1], **pdl_launch(a),
    )


def write_kv_triton(kv: Tensor, k: Tensor, v: Tensor, page_table: Tensor, cached_lens: Tensor,
                    cu_seqlens: Tensor) -> None:
    """``paged.write_kv`` in one launch. kv: [P, 2, page_size, Hkv, D] with each slot's [Hkv, D] at unit
    stride along D and D apart along Hkv; k, v: [N, Hkv, D]."""
    write_pair_triton(kv[:, 0], k, v, kv.stride(1), page_table, cached_lens, cu_seqlens)


def write_latent_triton(latent_pages: Tensor, latent: Tensor, k_rope: Tensor, page_table: Tensor,
                        cached_lens: Tensor, cu_seqlens: Tensor) -> None:
    """``mla.write_latent`` in one launch. latent_pages: [P, page_size, R + Dr] (unit stride in the last
    dim); latent: [N, R]; k_rope: [N, Dr]."""
    write_pair_triton(latent_pages, latent, k_rope, latent.shape[1], page_table, cached_lens, cu_seqlens)


def slot_is_flat(pages: Tensor, slot_dims: int) -> bool:
    """Whether the last `slot_dims` dims of `pages` are laid out as one unit-stride run (row-major)."""
    step = 1
    for size, stride in zip(reversed(pages.shape[-slot_dims:]), reversed(pages.stride()[-slot_dims:])):
        if size > 1 and stride != step:
            return False
        step *= size
    return True


WRITE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
