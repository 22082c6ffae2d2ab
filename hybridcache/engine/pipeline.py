"""Pipeline parallelism: stage s holds its contiguous layers and a cache store over them only; with tensor
parallelism inside the stages, each of its T ranks holds its shard of them (`parallel.pipeline.stage_rank`).

Rank 0 (stage 0's tensor-parallel rank 0) plans for the whole model and broadcasts every step and store
operation to every rank, as under tensor parallelism (`parallel.workers.MirroredStore`); every rank executes
the same plans. A step's activations go stage to stage by point-to-point send/recv (rank t of a stage to rank
t of the next: a stage's hidden states are whole on each of its ranks), each stage's forward all-reduces within
its own tensor-parallel group, and the last stage's rank 0 sends the logits back to rank 0. Stages run one
after another (no micro-batching). See docs/parallel.md.
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
from ..models.loader import load_model, model_on_meta
from ..models.registry import model_class
from ..parallel import SINGLE, TPGroup
from ..parallel.group import connect
from ..parallel.pipeline import (Stage, recv_object, recv_tensor, send_object, send_tensor, split_layers,
                                 stage_group_name, stage_rank)
from ..parallel.workers import STOP, MirroredStore, Workers, ready
from .cpu_threads import tune_cpu_threads
from .errors import InvalidParamsError
from .forward_batch import forward_batch
from .runner import ModelRunner

INIT, RUN = "pp_init", "pp_run"


@dataclass(frozen=True)
class StageCache:
    """What the store of stage `stage`'s tensor-parallel rank `tp_rank` holds: its slot and page roles, the
    bytes of one slot and one page over them (its shard of them), and its device arena."""

    stage: Stage
    tp_rank: int
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
    info = StageCache(model.stage, model.tp.rank, tuple(r.name for r in slot_roles),
                      tuple(r.name for r in page_roles), sizing.bytes_per_slot, sizing.bytes_per_page, arena)
    return store, info


def run_stage(model: Any, store: CacheStore, group: TPGroup, speculative: bool, plan: StepPlan,
              token_ids: np.ndarray, num_context_rows: int, verify_tokens: int,
              logit_positions: np.ndarray) -> torch.Tensor | None:
    """This rank's part of a step: the plan's store side, its stage's layers (its shard of them, all-reducing
    in the stage's tensor-parallel group `model.tp`) over the stage before's hidden states [N, D] (the ids'
    embedding on the first stage), then the hidden states on to the next stage, or, on the last stage's rank
    0, the logits [len(logit_positions), V] to rank 0. `group` holds every stage's ranks. Returns the logits
    on rank 0 (None if none)."""
    stage, tp, device = model.stage, model.tp, group.device
    indices = store.execute(plan)
    checked = not (plan.dummy & (plan.num_new > 0)).any()
    batch = forward_batch(store, indices, num_context_rows, verify_tokens, speculative, pages_checked=checked)
    ids = torch.from_numpy(np.asarray(token_ids)).to(device)
    hidden = None
    if not stage.is_first:
        src = stage_rank(stage.index - 1, tp.rank, tp.size)
        hidden = recv_tensor(group, (len(ids), model.spec.hidden_size), model.dtype, src)
    out = model(ids, batch, hidden)
    if not stage.is_last:
        send_tensor(group, out, stage_rank(stage.index + 1, tp.rank, tp.size))
        if group.rank == 0 and len(logit_positions):
            last = stage_rank(stage.size - 1, 0, tp.size)
            return recv_tensor(group, (len(logit_positions), model.vocab_size), torch.float32, last)
        return None
    if len(logit_positions) and tp.rank == 0:  # the LM head is whole on every rank of the stage
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
    """Give rank 0's manager (built over the whole model's roles, its shard of them under tensor parallelism:
    its planner plans every stage's slots and pages) stage 0's store instead, mirrored to every other rank,
    which builds its own to the same counts. Returns every rank's `StageCache` (by rank), as they report them."""
    local = manager.store
    counts = (local.device_tier.num_slots, local.device_tier.num_pages,
              local.host_tier.slot_records.shape[0], local.host_tier.page_records.shape[0])
    args = (num_draft_tokens, page_size, manager.config.device_bytes, manager.sizing, counts)
    workers.send(INIT, *args)
    store, info = build_store(model, *args, manager.device)
    manager.store = MirroredStore(store, workers)
    with workers.guard("starting the pipeline stages"):
        return [info] + [recv_object(workers.tp, rank) for rank in range(1, workers.tp.size)]


def start_stages(model: str, size: int, tp_size: int, device: torch.device, dtype: torch.dtype, timeout_s: float,
                 startup_s: float) -> tuple[Workers, Stage, TPGroup]:
    """Spawn every rank but rank 0: `tp_size` per stage of `size` (they load their layers while rank 0 loads
    its shard of stage 0's); returns the workers (connected by `Workers.connect()`, stage 0's tensor-parallel
    group with them), stage 0, and that group (SINGLE for `tp_size` 1), which rank 0's model keeps. The split
    and the shards are checked before any process starts (ShardingError)."""
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        raise InvalidParamsError("pipeline_parallel_size > 1 under torchrun is not supported yet: "
                                 "run one process, it starts the stages itself")
    stages = stages_of(model, size)
    tp = SINGLE
    if tp_size > 1:
        model_on_meta(model, dtype, TPGroup(0, tp_size))
        tp = TPGroup(0, tp_size, device=device)
    workers = Workers.spawn(size * tp_size, spawned_stage_main, (str(model), str(device), dtype, tp_size), device,
                            timeout_s, startup_s)
    if tp_size > 1:
        workers.subgroups.append((tp, stage_group_name(0)))
    return workers, stages[0], tp


def spawned_stage_main(rank: int, size: int, host: str, port: int, timeout_s: float, model: str, device: str,
                       dtype: torch.dtype, tp_size: int = 1) -> None:
    """The entry of a spawned rank (`Workers.spawn`): load its shard of its stage's layers, join every rank's
    group and its stage's tensor-parallel group, then serve."""
    store = dist.TCPStore(host, port, size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    dev = torch.device("cuda", rank) if torch.device(device).type == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    tune_cpu_threads(dev, read_config(model))
    index, tp_rank = divmod(rank, tp_size)
    tp = TPGroup(tp_rank, tp_size, device=dev) if tp_size > 1 else SINGLE
    part = load_model(model, device=dev, dtype=dtype, tp=tp, stage=stages_of(model, size // tp_size)[index])
    ready(store, rank)
    group = connect(store, TPGroup(rank, size, device=dev), timeout_s)
    if tp_size > 1:
        connect(store, tp, timeout_s, stage_group_name(index))  # its layers keep `tp`
    serve_stage(group, part)


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
