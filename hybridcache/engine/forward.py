"""Turns the manager's step indices into the model's `ForwardBatch`."""
from __future__ import annotations

import torch

from ..cache import HybridCacheManager, StepIndices
from ..models.batch import ForwardBatch


def forward_batch(
    manager: HybridCacheManager,
    step: StepIndices,
    num_context_rows: int,
    generation_tokens: int,
    speculative: bool,
) -> ForwardBatch:
    """Rows of `step` must be ordered context rows first; generation rows feed `generation_tokens` each."""
    num_new = step.num_new.long()
    cu = torch.zeros(num_new.shape[0] + 1, dtype=torch.long, device=num_new.device)
    torch.cumsum(num_new, 0, out=cu[1:])
    total = int(cu[-1])
    row_of_token = torch.repeat_interleave(torch.arange(num_new.shape[0], device=num_new.device), num_new, output_size=total)
    offset = torch.arange(total, device=num_new.device) - cu[:-1][row_of_token]
    positions = step.cached_lens.long()[row_of_token] + offset
    num_context_tokens = int(cu[num_context_rows])
    return ForwardBatch(
        positions=positions,
        cu_seqlens=cu.to(torch.int32),
        cached_lens=step.cached_lens,
        slots=step.slots,
        has_initial=~step.fresh,
        page_table=step.page_table,
        num_context_rows=num_context_rows,
        num_context_tokens=num_context_tokens,
        generation_tokens=generation_tokens,
        states={m.name: manager.state_tensors(m) for m in manager.states},
        pages=manager.page_tensors(),
        speculative=speculative,
    )
