"""Pipeline parallelism: stage s (rank s) holds its contiguous layers and a cache store over them only.

Rank 0 (stage 0) plans for the whole model and broadcasts every step and store operation, as under tensor
parallelism (`parallel.workers.MirroredStore`); every stage executes the same plans. A step's activations
go stage to stage by point-to-point send/recv, and the last stage sends the logits back to rank 0. Stages
run one after another (no micro-batching). See docs/parallel.md.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..cache import CacheStore, HybridCacheManager, StepPlan, plan_roles
from ..cache.roles import ALIGN
from ..cache.sizing import Sizing
from ..models.checkpoint import read_config
from ..models.loader import load_model
from ..models.registry import model_class
from ..parallel import TPGroup
from ..parallel.group import connect
from ..parallel.pipeline import Stage, recv_object, recv_tensor, send_object, send_tensor, split_layers
from ..parallel.workers import STOP, MirroredStore, Workers, ready
from .cpu_threads import tune_cpu_threads
from .errors import InvalidParamsError
from .forward_batch import forward_batch
from .runner import ModelRunner

INIT, RUN = "pp_init", "pp_run"


@dataclass(frozen=True)
class StageCache:
    """What stage `stage`'s store holds: its slot and page roles, the bytes of one slot and one page over
    them, and its device arena."""

    stage: Stage
    slot_roles: tuple[str, ...]
    page_roles: tuple[str, ...]
    slot_bytes: int
    page_bytes: int
    arena_bytes: int


def stages_of(model: str, size: int) -> list[Stage]:
    """The checkpoint's stages (ShardingError when `size` exceeds its layers; nothing is loaded)."""
    config = read_config(model)
    return split_layers(model_class(config.get("model_type")).num_layers(config), size)


def stage_arena_bytes(stage: Sizing, whole: Sizing, budget: int) -> int:
    """Device bytes that hold the stage's part of any carving of the whole model's `budget`: a carving of s
    slots and p pages has s*S + p*P <= budget (S, P: the whole model's bytes per slot, page), so the stage's
    s*S_i + p*P_i <= max(S_i/S, P_i/P) * budget; plus each of its roles' alignment."""
    shares = [-(-budget * part // full) for part, full in ((stage.bytes_per_slot, whole.bytes_per_slot),
                                                          (stage.bytes_per_page, whole.bytes_per_page)) if full]
    return max(shares, default=0) + ALIGN * (len(stage.slot_roles) + len(stage.page_roles))


def build_store(model: Any, num_draft_tokens: int, page_size: int, budget: int, whole: Sizing,
                counts: tuple[int, int, int, int], device: torch.device) -> tuple[CacheStore, StageCache]:
    """The stage's store over its own roles, carved to rank 0's counts (device slots with dummies, device
    pages, host slots, host pages): a stage without recurrent layers has no slot roles and zero slot bytes."""
    states = model.state_modules(num_draft_tokens)
    slot_roles, page_roles = plan_roles(states, model.page_roles(page_size))
    sizing = Sizing(tuple(slot_roles), tuple(page_roles))
    arena = stage_arena_bytes(sizing, whole, budget)
    store = CacheStore(states, slot_roles, page_roles, arena, *counts, device)
    info = StageCache(model.stage, tuple(r.name for r in slot_roles), tuple(r.name for r in page_roles),
                      sizing.bytes_per_slot, sizing.bytes_per_page, arena)
    return store, info


def run_stage(model: Any, store: CacheStore, group: TPGroup, speculative: bool, plan: StepPlan,
              token_ids: np.ndarray, num_context_rows: int, verify_tokens: int,
              logit_positions: np.ndarray) -> torch.Tensor | None:
    """This stage's part of a step: the plan's store side, its layers over the stage before's hidden states
    [N, D] (the ids' embedding on the first stage), then the hidden states on to the next stage, or, on the
    last, the logits [len(logit_positions), V] to rank 0. Returns the logits on rank 0 (None if none)."""
    stage, device = model.stage, group.device
    indices = store.execute(plan)
    checked = not (plan.dummy & (plan.num_new > 0)).any()
    batch = forward_batch(store, indices, num_context_rows, verify_tokens, speculative, pages_checked=checked)
    ids = torch.from_numpy(np.asarray(token_ids)).to(device)
    hidden = None
    if not stage.is_first:
        hidden = recv_tensor(group, (len(ids), model.spec.hidden_size), model.dtype, stage.index - 1)
    out = model(ids, batch, hidden)
    if not stage.is_last:
        send_tensor(group, out, stage.index + 1)
        if stage.is_first and len(logit_positions):
            return recv_tensor(group, (len(logit_positions), model.vocab_size), torch.float32, stage.size - 1)
        return None
    if len(logit_positions):
        send_tensor(group, model.logits(out[torch.from_numpy(logit_positions).to(device)]), 0)
    return None


class PipelineRunner(ModelRunner):
    """Rank 0's runner: each step is broadcast to the stages, then stage 0 runs and the logits come back
    from the last stage. A stage's failure raises TensorParallelError (`parallel.workers`)."""

    def __init__(self, model: Any, manager: HybridCacheManager, device: torch.device, speculative: bool,
                 workers: Workers, stages: list[StageCache]) -> None:
        super().__init__(model, manager, device, speculative, cuda_graphs=False, workers=workers)
        self.stages = stages

    @torch.inference_mode()
    def run(self, plan: StepPlan, token_ids: np.ndarray, num_context_rows: int, verify_tokens: int,
            logit_positions: np.ndarray) -> torch.Tensor | None:
        token_ids = token_ids.cpu().numpy() if isinstance(token_ids, torch.Tensor) else token_ids
        self.workers.send(RUN, plan, token_ids, num_context_rows, verify_tokens, logit_positions)
        with self.workers.guard("a pipeline step"):
            return run_stage(self.model, self.manager.store.local, self.workers.tp, self.speculative, plan,
                             token_ids, num_context_rows, verify_tokens, logit_positions)


def attach_stages(manager: HybridCacheManager, model: Any, workers: Workers, num_draft_tokens: int,
                  page_size: int) -> list[StageCache]:
    """Give rank 0's manager (built over the whole model's roles: its planner plans every stage's slots and
    pages) stage 0's store instead, mirrored to the other stages, which build theirs to the same counts.
    Returns every stage's `StageCache`, as the stages report them."""
    local = manager.store
    counts = (local.device_tier.num_slots, local.device_tier.num_pages,
              local.host_tier.slot_records.shape[0], local.host_tier.page_records.shape[0])
    args = (num_draft_tokens, page_size, manager.config.device_bytes, manager.sizing, counts)
    workers.send(INIT, *args)
    store, info = build_store(model, *args, manager.device)
    manager.store = MirroredStore(store, workers)
    with workers.guard("starting the pipeline stages"):
        return [info] + [recv_object(workers.tp, rank) for rank in range(1, workers.tp.size)]


def start_stages(model: str, size: int, device: torch.device, dtype: torch.dtype, timeout_s: float,
                 startup_s: float) -> tuple[Workers, Stage]:
    """Spawn stages 1..size-1 (they load their layers while rank 0 loads stage 0's); returns the workers
    (connected by `Workers.connect()`) and stage 0. The split is checked before any process starts."""
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        raise InvalidParamsError("pipeline_parallel_size > 1 under torchrun is not supported yet: "
                                 "run one process, it starts the stages itself")
    stages = stages_of(model, size)
    return Workers.spawn(size, spawned_stage_main, (str(model), str(device), dtype), device, timeout_s,
                         startup_s), stages[0]


def spawned_stage_main(rank: int, size: int, host: str, port: int, timeout_s: float, model: str, device: str,
                       dtype: torch.dtype) -> None:
    """The entry of a spawned stage process (`Workers.spawn`): load stage `rank`'s layers, then serve."""
    store = dist.TCPStore(host, port, size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    dev = torch.device("cuda", rank) if torch.device(device).type == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    tune_cpu_threads(dev, read_config(model))
    part = load_model(model, device=dev, dtype=dtype, stage=stages_of(model, size)[rank])
    ready(store, rank)
    serve_stage(connect(store, TPGroup(rank, size, device=dev), timeout_s), part)


@torch.inference_mode()
def serve_stage(group: TPGroup, model: Any) -> None:
    """Run rank 0's messages over this stage: INIT (build the store, report it), RUN (a step), a store
    operation by name, or STOP. It plans nothing and samples nothing."""
    store, speculative = None, False
    while True:
        op, args = group.broadcast_object(idle=True)
        if op == STOP:
            return
        if op == INIT:
            store, info = build_store(model, *args, group.device)
            speculative = args[0] > 0
            send_object(group, info, 0)
        elif op == RUN:
            run_stage(model, store, group, speculative, *args)
        elif op in MirroredStore.MUTATING:
            getattr(store, op)(*args)
        else:
            raise RuntimeError(f"stage {group.rank}: unknown message {op!r}")
