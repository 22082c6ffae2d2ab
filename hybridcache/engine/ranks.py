"""The other ranks of a parallel LLM: tensor-parallel workers or pipeline stages, started before rank 0 loads
its model, and told how to build their stores once rank 0's cache exists (docs/parallel.md)."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..cache import HybridCacheManager
from ..models.loader import model_on_meta
from ..parallel import SINGLE, TPGroup
from ..parallel.workers import MirroredStore, Workers


def start_ranks(model: str | Path, tensor_parallel_size: int, pipeline_parallel_size: int, device: torch.device,
                dtype: torch.dtype, timeout_s: float, startup_s: float) -> tuple[Workers | None, object, TPGroup]:
    """(workers, stage, tp): the other ranks (None for one rank); pipeline stage 0's layers, or None for the
    whole model (or a tensor-parallel shard of it); rank 0's tensor-parallel group."""
    if pipeline_parallel_size > 1:  # tp: stage 0's tensor-parallel group
        from .pipeline import start_stages
        return start_stages(model, pipeline_parallel_size, tensor_parallel_size, device, dtype, timeout_s, startup_s)
    workers = _start_workers(model, tensor_parallel_size, device, dtype, timeout_s, startup_s)
    return workers, None, workers.tp if workers else SINGLE


def attach_ranks(manager: HybridCacheManager, model: torch.nn.Module, workers: Workers | None, stage: object,
                 num_draft_tokens: int, page_size: int):
    """Have every other rank build its store like rank 0's, which then mirrors its operations to theirs;
    returns the pipeline's stage caches (None without pipeline stages)."""
    if stage is not None:
        from .pipeline import attach_stages
        return attach_stages(manager, model, workers, num_draft_tokens, page_size)
    if workers is not None:
        workers.send("init", num_draft_tokens, page_size, manager.config, (manager.num_slots, manager.num_pages))
        manager.store = MirroredStore(manager.store, workers)
    return None


def _start_workers(model: str | Path, size: int, device: torch.device, dtype: torch.dtype, timeout_s: float,
                   startup_s: float) -> Workers | None:
    """The N-1 worker ranks, spawned; None for one rank. The split is checked (ShardingError) before
    any process starts. Under torchrun (TORCHELASTIC_RUN_ID set) every rank runs the LLM's constructor:
    rank 0 returns, the others serve it and exit (`tp_worker.launched_main`)."""
    if size == 1:
        return None
    model_on_meta(model, dtype, TPGroup(0, size))
    from .tp_worker import launched_main, spawned_main  # the workers' entry points

    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        return launched_main(model, device, dtype, size, timeout_s)
    return Workers.spawn(size, spawned_main, (str(model), str(device), dtype), device, timeout_s, startup_s)
