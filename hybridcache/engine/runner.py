"""Turns a scheduled step into one model forward and returns, per row, the logits it needs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache import HybridCacheManager
from .forward import forward_batch
from .scheduler import ScheduledStep


@dataclass
class StepLogits:
    """context: logits [V] of each context row's last token (None when its prompt is not done);
    generation: logits [T, V] of each generation row."""

    context: list[torch.Tensor | None]
    generation: list[torch.Tensor]


class ModelRunner:
    def __init__(self, model: torch.nn.Module, manager: HybridCacheManager, device: torch.device, speculative: bool) -> None:
        self.model = model
        self.manager = manager
        self.device = device
        self.speculative = speculative

    @torch.inference_mode()
    def run(self, step: ScheduledStep, drafts: dict[int, list[int]], generation_tokens: int) -> StepLogits:
        ids: list[int] = []
        tokens: list[int] = []
        counts: list[int] = []
        for req, chunk in step.context:
            ids.append(req.req_id)
            tokens += req.tokens[req.num_prefilled : req.num_prefilled + chunk]
            counts.append(chunk)
        for req in step.generation:
            ids.append(req.req_id)
            tokens += [req.tokens[-1]] + drafts.get(req.req_id, [])
            counts.append(generation_tokens)
        indices = self.manager.prepare_step(ids, counts)
        try:
            batch = forward_batch(self.manager, indices, len(step.context), generation_tokens, self.speculative)
            hidden = self.model(torch.tensor(tokens, dtype=torch.long, device=self.device), batch)
        except BaseException:
            self.manager.cancel_step()  # nothing was committed: the same rows can run again
            raise
        ends, offset = [], 0
        wanted: list[int] = []
        for (req, chunk), n in zip(step.context, counts):
            offset += n
            done = req.num_prefilled + chunk == req.context_len and not req.output
            ends.append(len(wanted) if done else None)
            if done:
                wanted.append(offset - 1)
        gen_start = len(wanted)
        wanted += list(range(offset, offset + generation_tokens * len(step.generation)))
        logits = self.model.logits(hidden[torch.tensor(wanted, dtype=torch.long, device=self.device)]) if wanted else None
        context = [None if e is None else logits[e] for e in ends]
        generation = [
            logits[gen_start + i * generation_tokens : gen_start + (i + 1) * generation_tokens]
            for i in range(len(step.generation))
        ]
        return StepLogits(context, generation)
