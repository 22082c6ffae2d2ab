"""`PrefilledRequest`: a request whose prompt one engine prefilled, as it travels to the engine that decodes it
(disaggregated prefill, `hybridcache.disagg`): its tokens, sampling state and cache state in the host
tier's saved form. Plain data: picklable, the records plain uint8 tensors."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .params import SamplingParams
from .request import TokenLogprob


@dataclass(frozen=True)
class PrefilledRequest:
    """prompt        token ids, all of them committed to the cache
    output        tokens sampled so far (the first one, not yet in the cache)
    seed          int64 bits of the sampling seed (the draws hash (seed, position): sampling goes on alike)
    slot_record   [slot nbytes] uint8: every recurrent role's live bytes (`cache.roles.RecordLayout`)
    page_records  [pages, page nbytes] uint8: the K/V pages of the prompt, in order"""

    prompt: list[int]
    output: list[int]
    params: SamplingParams
    seed: int
    slot_record: torch.Tensor
    page_records: torch.Tensor
    logprobs: list[TokenLogprob] | None = None
