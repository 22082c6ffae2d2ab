"""Executes a step plan: the store's side, one model forward, and the logits of the positions asked for.

It sees plans, token ids and positions, never a request.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..cache import HybridCacheManager, StepPlan
from ..parallel.workers import Workers
from .device_sampler import RowParams
from .forward_batch import forward_batch, generation_positions
from .graphs import DecodeGraphs


class ModelRunner:
    """`cuda_graphs`: generation-only steps on CUDA replay captured graphs (`graphs.DecodeGraphs`).

    `workers`: this is rank 0 of a tensor-parallel group; each step is broadcast to the workers before it
    runs here, and a worker's failure during it raises TensorParallelError (`parallel.workers`)."""

    def __init__(self, model: torch.nn.Module, manager: HybridCacheManager, device: torch.device, speculative: bool,
                 cuda_graphs: bool = False, workers: Workers | None = None) -> None:
        self.model = model
        self.manager = manager
        self.device = device
        self.speculative = speculative
        self.workers = workers
        use_graphs = cuda_graphs and device.type == "cuda" and workers is None
        self.graphs = DecodeGraphs(model, manager.store) if use_graphs else None

    @torch.inference_mode()
    def run(self, plan: StepPlan, token_ids: np.ndarray, num_context_rows: int, verify_tokens: int,
            logit_positions: np.ndarray) -> torch.Tensor | None:
        """token_ids [N] the step's tokens (on the host, or already on the device), row after row (context rows
        first, then `verify_tokens` per generation row); returns logits [len(logit_positions), V] of those flat
        positions (None if none).

        Raises what the forward raises; the caller aborts the plan (its rows may have been written)."""
        if self.workers is not None:
            self.workers.send("run", plan, token_ids, num_context_rows, verify_tokens)
            with self.workers.guard("a tensor-parallel step"):
                return self._run(plan, token_ids, num_context_rows, verify_tokens, logit_positions,
                                 self.manager.store.local)
        return self._run(plan, token_ids, num_context_rows, verify_tokens, logit_positions, self.manager.store)

    @torch.inference_mode()
    def run_verify_choice(self, plan: StepPlan, token_ids: torch.Tensor, verify_tokens: int, proposed: torch.Tensor,
                          sampling: RowParams | None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """A step of generation rows, each feeding `verify_tokens` (its last token, then its drafts):
        token_ids [B * T] and proposed [B] (the real drafts a row) on the device; `sampling` the rows'
        parameters, None when all are greedy. Returns the logits [B * T, V] of every fed token and, where
        the step replayed a graph, the choice that graph made (choice [B, 2 + T], counts [B]:
        `DecodeGraphs.run_verify_choice`, the accept hooks applied); else None, and the caller chooses and
        accepts."""
        if self.workers is not None or self.graphs is None:
            return self.run(plan, token_ids, 0, verify_tokens, np.arange(len(token_ids))), None
        store = self.manager.store
        batch = forward_batch(store, store.execute(plan), 0, verify_tokens, self.speculative,
                              pages_checked=_pages_checked(plan), with_positions=False)
        out = self.graphs.run_verify_choice(token_ids, batch, proposed, sampling)
        if out is not None:
            return out[0], out[1:]
        logits = self.graphs.run(token_ids, batch)  # a tail that could not be captured: the forward alone
        if logits is not None:
            return logits, None
        batch = replace(batch, positions=generation_positions(batch.cached_lens, verify_tokens))
        return self.model.logits(self.model(token_ids, batch)), None

    def _run(self, plan: StepPlan, token_ids: np.ndarray, num_context_rows: int, verify_tokens: int,
             logit_positions: np.ndarray, store) -> torch.Tensor | None:
        indices = store.execute(plan)
        graph_step = self.graphs is not None and not num_context_rows and len(logit_positions) > 0
        batch = forward_batch(store, indices, num_context_rows, verify_tokens, self.speculative,
                              pages_checked=_pages_checked(plan), with_positions=not graph_step)
        # copies from pageable memory that do not wait for the device (a blocking one synchronises on CUDA)
        ids = token_ids if isinstance(token_ids, torch.Tensor) else torch.from_numpy(token_ids).to(
            self.device, non_blocking=True)
        if not len(logit_positions):  # context chunks whose prompts go on: their state is what they leave
            self.model(ids, batch)
            return None
        every = len(logit_positions) == len(token_ids)  # a decode or verify step: no positions to upload
        logits = self.graphs.run(ids, batch) if graph_step else None
        if logits is not None and every:
            return logits
        if batch.positions is None:  # the graph did not take it after all: eager, positions from the device
            batch = replace(batch, positions=generation_positions(batch.cached_lens, verify_tokens))
        positions = torch.from_numpy(logit_positions).to(self.device, non_blocking=True)
        if logits is not None:
            return logits[positions]
        return self.model.logits(self.model(ids, batch)[positions])


def _pages_checked(plan: StepPlan) -> bool:
    """plan_step refuses a plan whose rows lack pages for their tokens; a dummy row is not checked."""
    return not (plan.dummy & (plan.num_new > 0)).any()
