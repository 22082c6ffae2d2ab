"""What a model forward needs besides the token ids; the engine's runner builds it from step indices."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

import torch

from ..ops.attention import HostRows


@dataclass(frozen=True)
class ForwardBatch:
    """One forward over `B` rows and `N` flat tokens.

    Rows are ordered: the `num_context_rows` context (prefill) rows first, holding the first
    `num_context_tokens` tokens (varlen, `cu_seqlens`), then the generation rows, each feeding exactly
    `generation_tokens` tokens (1 for plain decode; k + 1 for a speculative verify step).

    positions     [N] int64   absolute position of each token (None only on the way into a graph step,
                              which computes them from cached_lens)
    cu_seqlens    [B+1] int32 token offsets of the rows
    cached_lens   [B] int32   tokens already committed before this step (attention prefix length)
    slots         [B] int64   recurrent slot of each row (negative: padding, reads zeros, writes nothing)
    has_initial   [B] bool    False: the row starts from a zero recurrent state
    page_table    [B, P] int32 the row's pages, -1 past the end
    states        state-module name -> local role name -> role tensor [layers, slots, ...]
    pages         page-role full name -> page tensor [layers, pages, ...]
    speculative   generation rows run the replay verify ops (True) or the plain decode ops (False)
    host_rows     cached_lens and the row lengths on the host (numpy), and whether the page table was
                  checked there, so that the attention ops read nothing back; None: the ops read them
    """

    positions: torch.Tensor | None
    cu_seqlens: torch.Tensor
    cached_lens: torch.Tensor
    slots: torch.Tensor
    has_initial: torch.Tensor
    page_table: torch.Tensor
    num_context_rows: int
    num_context_tokens: int
    generation_tokens: int
    states: Mapping[str, Mapping[str, torch.Tensor]]
    pages: Mapping[str, torch.Tensor]
    speculative: bool
    host_rows: HostRows | None = None

    @property
    def num_rows(self) -> int:
        return self.slots.shape[0]

    @property
    def num_generation_rows(self) -> int:
        return self.num_rows - self.num_context_rows

    @cached_property
    def context_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """slots, has_initial [Bc] and cu_seqlens [Bc+1] of the context rows: the same tensor objects for
        every layer of the batch, so a kernel library that caches by tensor identity (fla's chunk indices)
        prepares them once per step."""
        bc = self.num_context_rows
        return self.slots[:bc], self.has_initial[:bc], self.cu_seqlens[: bc + 1]
