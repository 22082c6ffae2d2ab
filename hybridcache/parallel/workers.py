"""Rank 0's side of a tensor-parallel group: the worker processes it starts (torch.multiprocessing, spawn),
the messages it broadcasts to them, and how a dead or hung worker reaches the caller as a typed error.

Every message is `(op, args)`, broadcast in program order; the workers run the same ops in the same
order (`engine/tp_worker.py`), so every rank's store holds its shard of the same bytes in the same rows.
"""
from __future__ import annotations

import copy
import datetime
import logging
import multiprocessing as mp
import pickle
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from .errors import TensorParallelError
from .group import TPGroup, connect

log = logging.getLogger(__name__)
HOST = "127.0.0.1"
STOP = "stop"
SEND_RECORDS, RECV_RECORDS = "send_records", "recv_records"  # a request's shard leaves / joins a worker's store
READY = "hybridcache_tp_ready/"


def ready(store: dist.Store, rank: int) -> None:
    """Tell rank 0 that this worker has loaded its shard and is about to connect."""
    store.set(f"{READY}{rank}", "1")


class Workers:
    """Ranks 1..size-1 of a group whose rank 0 is this process.

    `target(rank, size, host, port, timeout_s, *args)` runs in each spawned process (an importable
    function); it loads the rank's shard, calls `ready(store, rank)`, then `connect`s. `processes` is empty
    when the ranks were started by a launcher (torchrun) and `tp` given. `subgroups`: smaller groups rank 0
    also belongs to (a pipeline stage's tensor-parallel group), each with its rendezvous name: `connect`
    forms them after the whole group, and they go with it.
    Any collective that fails, or any worker found dead, raises TensorParallelError, and so does every
    later call: the group is then unusable (a rank's shard of every request's state is gone)."""

    def __init__(self, tp: TPGroup, processes: list[Any], timeout_s: float) -> None:
        self.tp, self.processes, self.timeout_s = tp, processes, timeout_s
        self.subgroups: list[tuple[TPGroup, str]] = []
        self.failure: str | None = None
        self.closed = False

    @classmethod
    def spawn(cls, size: int, target: Callable[..., None], args: tuple, device: torch.device,
              timeout_s: float, startup_s: float = 600.0) -> "Workers":
        """Start ranks 1..size-1; `connect()` then waits for them (rank 0 loads its shard meanwhile, with
        `tp`, which `connect` completes)."""
        store = dist.TCPStore(HOST, 0, size, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                              wait_for_workers=False)
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=target, args=(rank, size, HOST, store.port, timeout_s, *args), daemon=True,
                             name=f"hybridcache-tp{rank}") for rank in range(1, size)]
        workers = cls(TPGroup(0, size, device=device), procs, timeout_s)
        workers._store, workers._startup_s = store, startup_s  # the rendezvous, kept alive with the group
        for p in procs:
            p.start()
        return workers

    def connect(self) -> None:
        """Wait for every worker to load its shard, then form the group (TensorParallelError if one exits
        first or the start takes longer than `startup_s`). A launcher's group is formed already."""
        if self.tp.pg is not None:
            return
        self._wait_ready(self._store, self._startup_s)
        with self.guard("connecting to the workers"):
            connect(self._store, self.tp, self.timeout_s)
            for group, name in self.subgroups:
                connect(self._store, group, self.timeout_s, name)

    def _wait_ready(self, store: dist.TCPStore, startup_s: float) -> None:
        """Until every worker has loaded its shard (`ready(store, rank)`); one that exits first, or a
        start slower than `startup_s`, raises TensorParallelError."""
        keys = [f"{READY}{i + 1}" for i in range(len(self.processes))]
        deadline = time.monotonic() + startup_s
        while not store.check(keys):
            self.check()
            if time.monotonic() > deadline:
                self._fail(f"the workers did not load their shards within {startup_s:g} s "
                           f"(parallel_startup_timeout_s)")
                self.close()
                raise TensorParallelError(self.failure)
            time.sleep(0.02)

    # ------------------------------------------------------------------ messages
    def send(self, op: str, *args: Any) -> None:
        """Broadcast `(op, args)` to every worker (arguments that do not pickle send nothing)."""
        self.check()
        data = pickle.dumps((op, args), protocol=pickle.HIGHEST_PROTOCOL)
        with self.guard(f"sending {op!r} to the workers"):
            self.tp.broadcast_bytes(data)

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run rank 0's side of an exchange with the workers: a collective, or a step whose forward
        all-reduces (or sends and receives). Whatever escapes it fails the group, since the workers may wait
        inside the same exchange: a distributed failure or a dead worker, and rank 0's own error too (an
        exception or an interrupt in its forward or its store's execution of the plan). The group is dropped at
        once, which ends the workers' waits (`_abort`), and the caller gets TensorParallelError naming the
        failure (chained to it); an interrupt (KeyboardInterrupt, SystemExit) goes on as itself."""
        self.check()
        try:
            yield
        except BaseException as e:
            # gloo's closed connections are plain RuntimeErrors naming gloo
            peer = isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and "gloo" in str(e).lower()) \
                or bool(self._dead())
            if peer:
                self._fail(f"{what} failed: {e}".strip())
            else:
                self._fail(f"{what} failed on rank 0 ({type(e).__name__}: {e}) while the workers were inside it",
                           rank0=True)
            self._abort()
            if not isinstance(e, Exception):
                raise
            raise TensorParallelError(self.failure) from e

    def check(self) -> None:
        """TensorParallelError if the group failed before or a worker has exited."""
        if self.closed:
            raise TensorParallelError("the tensor-parallel workers are closed")
        if self.failure is None and self._dead():
            self._fail("")
        if self.failure is not None:
            raise TensorParallelError(self.failure)

    def _dead(self, wait_s: float = 0.0) -> list[str]:
        deadline = time.monotonic() + wait_s
        while True:
            dead = [f"rank {i + 1} exited with code {p.exitcode}" for i, p in enumerate(self.processes)
                    if p.exitcode is not None]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def _fail(self, what: str, rank0: bool = False) -> None:
        dead = self._dead()
        head = "tensor-parallel group failure: " if rank0 else "tensor-parallel worker failure: "
        what = "; ".join([*dead, what] if what else dead)
        self.failure = f"{head}{what} (close this LLM; its requests' state is lost)"
        log.error(self.failure)

    def _abort(self) -> None:
        """Drop the failed group (and the subgroups) so that every worker's pending wait ends now rather than at
        the group timeout: gloo closes its connections when a group goes (a worker's collective raises and its
        process exits); NCCL's communicators are aborted and the spawned workers are killed (a rank inside an
        NCCL kernel does not see its peer go). A launcher's default group is destroyed."""
        pgs = [g.pg for g in (self.tp, *(g for g, _ in self.subgroups)) if g.pg is not None]
        self._drop_groups()
        if not pgs:
            return
        if not self.processes and dist.is_initialized():
            dist.destroy_process_group()  # torch holds the launcher's group too
        elif self.tp.device.type == "cuda":
            while pgs:
                pgs.pop().abort()
            for p in self.processes:
                if p.exitcode is None:
                    p.kill()
        del pgs  # the last references: gloo's connections close here

    def _drop_groups(self) -> None:
        self.tp.pg = None
        for group, _ in self.subgroups:
            group.pg = None

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Stop the workers (a stop message, then terminate any still running); idempotent."""
        if self.closed:
            return
        if self.failure is None and self.tp.pg is not None and not self._dead():
            try:
                self.send(STOP)
            except TensorParallelError:
                pass
        self.closed = True
        for p in self.processes:
            if self.failure is not None and p.exitcode is None:
                p.kill()  # a failed group: no stop message reaches it
            p.join(timeout=10)
            if p.exitcode is None:
                p.kill()
                p.join(timeout=5)
        if not self.processes and self.tp.pg is not None and dist.is_initialized():
            dist.destroy_process_group()  # a launcher's default group (torchrun)
        self._drop_groups()


def send_tensor(tp: TPGroup, t: torch.Tensor, dst: int) -> None:
    """Point-to-point within the group (a host tensor travels through the rank's device for NCCL)."""
    if t.numel():
        tp.pg.send([t.contiguous().to(tp.device)], dst, 0).wait(tp.timeout)


def recv_tensor(tp: TPGroup, t: torch.Tensor, src: int) -> torch.Tensor:
    """Fill host tensor `t` from rank `src`; returns it."""
    if t.numel():
        buf = t if tp.device.type == "cpu" else torch.empty_like(t, device=tp.device)
        tp.pg.recv([buf], src, 0).wait(tp.timeout)
        t.copy_(buf)
    return t


class MirroredStore:
    """Rank 0's cache store: each call that changes a store (`MUTATING`) is made here, then broadcast to the
    workers, which make it on their own stores; everything else reads this rank's store (`local`). A call
    that fails here (a store operation is a transaction: it leaves this store as before, or restores the old
    carving and raises StateLostError) is never sent, so the ranks cannot diverge; one that fails on a
    worker fails the group (TensorParallelError).

    Moving a request between engines (`hybridcache.disagg`) needs every rank's shard: `read_records` also
    gathers the workers' records into `gathered` (ranks 1..N-1, by rank), and `write_host` writes the
    records set in `to_scatter` (ranks 1..N-1) on the workers, point to point."""

    MUTATING = frozenset({"execute", "accept", "zero_slots", "copy", "recarve", "synchronize", "save_snapshots"})

    def __init__(self, local: Any, workers: Workers) -> None:
        self.local, self.workers = local, workers
        self.gathered: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.to_scatter: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def read_records(self, slot: int, pages: Any) -> Any:
        """Rank 0's records of device `slot` and `pages` (`CacheStore.read_records`); the workers' go to `gathered`."""
        pages = [int(p) for p in pages]
        rec = self.local.read_records(slot, pages)
        self.workers.send(SEND_RECORDS, int(slot), pages)
        tp, gathered = self.workers.tp, []
        with self.workers.guard("gathering a request's records"):
            for rank in range(1, tp.size):
                gathered.append((recv_tensor(tp, torch.empty_like(rec.slot_records[0]), rank),
                                 recv_tensor(tp, torch.empty_like(rec.page_records), rank)))
        self.gathered = gathered
        return rec

    def write_host(self, host_slot: int, host_pages: Any, slot_record: torch.Tensor, page_records: torch.Tensor) -> None:
        """Write rank 0's records here and `to_scatter`'s (taken) on the workers; without them, refuse
        (a tensor-parallel engine adopts a request only with every rank's shard)."""
        shards, self.to_scatter = self.to_scatter, None
        if shards is None or len(shards) != self.workers.tp.size - 1:
            raise ValueError("a tensor-parallel engine adopts a request only with every rank's records "
                             "(hybridcache.disagg sets MirroredStore.to_scatter)")
        host_pages = [int(p) for p in host_pages]
        self.local.write_host(host_slot, host_pages, slot_record, page_records)
        self.workers.send(RECV_RECORDS, int(host_slot), host_pages)
        with self.workers.guard("scattering a request's records"):
            for rank, (slot_rec, page_recs) in enumerate(shards, start=1):
                send_tensor(self.workers.tp, slot_rec, rank)
                send_tensor(self.workers.tp, page_recs, rank)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.local, name)
        if name not in self.MUTATING:
            return attr

        def mirrored(*args: Any) -> Any:
            message = copy.deepcopy(args)  # as the call received them
            out = attr(*args)  # a failure here leaves this store as before and the workers untouched
            self.workers.send(name, *message)
            return out

        return mirrored
