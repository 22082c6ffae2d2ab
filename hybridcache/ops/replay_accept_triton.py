"""The replay accept rule (`replay_accept.replay_accept`) as one Triton launch: per row, the slot's
bookkeeping read and rewritten by the same program, so no two programs touch one slot (a slot has one
owner in a batch) and no gather/scatter kernels surround it. Graph-capturable, no host sync."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl_triton import pdl_entry, pdl_launch

BLOCK = 128


@triton.jit
def _accept_kernel(pnat_ptr, buf_ptr, slot_ptr, tokens_ptr, valid_ptr, B, HIST, num_tokens,
                   PER_ROW_TOKENS: tl.constexpr, BLOCK_B: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    in_batch = rows < B
    slot = tl.load(slot_ptr + rows, mask=in_batch, other=-1).to(tl.int64)
    live = in_batch & (slot >= 0)
    s = tl.maximum(slot, 0)
    p = tl.load(pnat_ptr + s, mask=live, other=0)
    b = tl.load(buf_ptr + s, mask=live, other=0)
    if PER_ROW_TOKENS:
        t = tl.load(tokens_ptr + rows, mask=live, other=0)
    else:
        t = num_tokens
    v = tl.load(valid_ptr + rows, mask=live, other=0).to(p.dtype)
    folded = p + t > HIST
    tl.store(pnat_ptr + s, tl.where(folded, v, p + v), mask=live)
    tl.store(buf_ptr + s, tl.where(folded, 1 - b, b), mask=live)


def replay_accept_triton(pnat: torch.Tensor, buf_idx: torch.Tensor, slots: torch.Tensor,
                         num_tokens: int | torch.Tensor, num_valid: torch.Tensor, hist: int) -> None:
    """`replay_accept` with the same arguments; pnat, buf_idx contiguous [S] int32, updated in place."""
    batch = slots.shape[0]
    if batch == 0:
        return
    per_row = isinstance(num_tokens, torch.Tensor)
    tokens = num_tokens.to(slots.device) if per_row else slots
    _accept_kernel[(triton.cdiv(batch, BLOCK),)](
        pnat, buf_idx, slots, tokens, num_valid.to(slots.device), batch, hist, 0 if per_row else int(num_tokens),
        PER_ROW_TOKENS=per_row, BLOCK_B=BLOCK, **pdl_launch(pnat))
