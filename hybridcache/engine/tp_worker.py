"""A tensor-parallel worker rank (1..N-1): loads its shard of the model, builds its cache store from rank 0's
config, then executes rank 0's broadcast messages until told to stop. It plans nothing and samples
nothing; rank 0's planner decides and every rank executes the same plans (docs/parallel.md)."""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..cache import HybridCacheManager
from ..models.checkpoint import read_config
from ..models.loader import load_model
from ..parallel import TPGroup
from ..parallel.group import connect, from_default_group
from ..parallel.workers import (RECV_RECORDS, SEND_RECORDS, STOP, MirroredStore, Workers, ready, recv_tensor,
                                send_tensor)
from .cpu_threads import tune_cpu_threads
from .runner import ModelRunner

log = logging.getLogger(__name__)
INIT = "init"


def rank_device(device: str, rank: int) -> torch.device:
    """Rank r's device: CUDA device r on one host (the lead's device index is ignored), else the CPU."""
    return torch.device("cuda", rank) if torch.device(device).type == "cuda" else torch.device("cpu")


def spawned_main(rank: int, size: int, host: str, port: int, timeout_s: float, model: str, device: str,
                 dtype: torch.dtype) -> None:
    """The entry of a spawned worker process (`parallel.workers.Workers.spawn`)."""
    store = dist.TCPStore(host, port, size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    dev = rank_device(device, rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    tp = TPGroup(rank, size, device=dev)
    tune_cpu_threads(dev, read_config(model))
    shard = load_model(model, device=dev, dtype=dtype, tp=tp)  # its layers keep `tp`: connected below
    ready(store, rank)
    serve(connect(store, tp, timeout_s), shard, dev)


def launched_main(model: str | Path, device: torch.device, dtype: torch.dtype, size: int,
                  timeout_s: float) -> Workers:
    """Under a launcher (torchrun), where every rank runs the caller's program: the default process group.
    Rank 0 gets its `Workers` (no processes of its own to watch: a dead or hung rank shows as a collective
    that fails or times out); any other rank loads its shard, serves rank 0 until it closes, and exits
    the program (SystemExit(0)): code after the LLM's construction runs on rank 0 only."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local) if device.type == "cuda" else torch.device("cpu")
    tp = from_default_group(dev, timeout_s)
    if tp.size != size:
        raise ValueError(f"the launcher started {tp.size} ranks but tensor_parallel_size is {size}")
    if tp.rank == 0:
        return Workers(tp, [], timeout_s)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    tune_cpu_threads(dev, read_config(model))
    serve(tp, load_model(model, device=dev, dtype=dtype, tp=tp), dev)
    dist.destroy_process_group()
    raise SystemExit(0)


def serve(tp: TPGroup, shard: torch.nn.Module, device: torch.device) -> None:
    """Run rank 0's messages over this rank's loaded shard: `init` (the cache), `run` (a step: the plan's
    store side and the forward, no logits), a store operation by name, or `stop`."""
    runner = None
    while True:
        op, args = tp.broadcast_object(idle=True)
        if op == STOP:
            return
        if op == INIT:
            num_draft_tokens, page_size, config, counts = args
            config = dataclasses.replace(config, device=str(device))
            manager = HybridCacheManager(shard.state_modules(num_draft_tokens), shard.page_roles(page_size), config)
            if (manager.num_slots, manager.num_pages) != counts:
                raise RuntimeError(f"rank {tp.rank} carved {(manager.num_slots, manager.num_pages)} slots and pages, "
                                   f"rank 0 {counts}: the shards' sizing differs")
            runner = ModelRunner(shard, manager, device, num_draft_tokens > 0)
        elif op == "run":
            plan, token_ids, num_context_rows, verify_tokens = args
            runner.run(plan, token_ids, num_context_rows, verify_tokens, np.empty(0, dtype=np.int64))
        elif op == SEND_RECORDS:  # a request leaves: this rank's shard of its records to rank 0
            rec = runner.manager.store.read_records(*args)
            send_tensor(tp, rec.slot_records[0], 0)
            send_tensor(tp, rec.page_records, 0)
        elif op == RECV_RECORDS:  # a request joins: this rank's shard into the host tier at rank 0's ids
            host_slot, host_pages = args
            host = runner.manager.store.host_tier
            slot = recv_tensor(tp, torch.empty(host.slot_layout.nbytes, dtype=torch.uint8), 0)
            pages = recv_tensor(tp, torch.empty(len(host_pages), host.page_layout.nbytes, dtype=torch.uint8), 0)
            runner.manager.store.write_host(host_slot, host_pages, slot, pages)
        elif op in MirroredStore.MUTATING:
            getattr(runner.manager.store, op)(*args)
        else:
            raise RuntimeError(f"rank {tp.rank}: unknown message {op!r}")
