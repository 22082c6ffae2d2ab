"""`TPGroup`: this rank's place in a tensor-parallel group and the collectives the model and engine use."""
from __future__ import annotations

import datetime
import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


IDLE = datetime.timedelta(days=365)  # how long a worker waits for rank 0's next message (it may sit idle)


@dataclass(eq=False)
class TPGroup:
    """`rank` of `size`; `pg` the process group (None when `size` is 1, for a model built only to be
    inspected, e.g. on the meta device, or until `connect` sets it: a worker loads its shard, whose layers
    keep this object, before the group exists). `device`: where this rank's collectives' tensors live. Every
    collective raises after `timeout` (per operation) instead of waiting for a dead or hung rank forever,
    except a worker's wait for rank 0's next message (`broadcast_object(idle=True)`)."""

    rank: int = 0
    size: int = 1
    pg: Any = None
    device: torch.device = torch.device("cpu")
    timeout: datetime.timedelta = datetime.timedelta(seconds=120)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns it (a no-op for one rank)."""
        if self.size > 1:
            opts = dist.AllreduceOptions()
            opts.timeout = self.timeout
            self.pg.allreduce([x], opts).wait()
        return x

    def broadcast_object(self, obj: Any = None, idle: bool = False) -> Any:
        """Rank 0's `obj` on every rank (pickled, then `broadcast_bytes`). `idle`: a receiving rank waits
        for the length without a bound (rank 0 sends when it has work; its death still ends the wait)."""
        if self.rank == 0:
            self.broadcast_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
            return obj
        return pickle.loads(self.broadcast_bytes(idle=idle))

    def broadcast_bytes(self, data: bytes | None = None, idle: bool = False) -> bytes:
        """Rank 0's `data` on every rank: its length, then the bytes (`idle` as in `broadcast_object`)."""
        if self.rank == 0:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            n = torch.tensor([buf.numel()], dtype=torch.int64)
        else:
            n = torch.zeros(1, dtype=torch.int64)
        n = n.to(self.device)
        self.pg.broadcast([n], self._root(IDLE if idle else self.timeout)).wait()
        if self.rank == 0:
            buf = buf.to(self.device)
        else:
            buf = torch.empty(int(n.item()), dtype=torch.uint8, device=self.device)
        self.pg.broadcast([buf], self._root(self.timeout)).wait()
        return data if self.rank == 0 else buf.cpu().numpy().tobytes()

    @staticmethod
    def _root(timeout: datetime.timedelta) -> dist.BroadcastOptions:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.timeout = 0, timeout
        return opts


SINGLE = TPGroup()


def connect(store: dist.Store, tp: TPGroup, timeout_s: float, name: str = "hybridcache_tp") -> TPGroup:
    """Give `tp` its process group over `store` (gloo for CPU tensors, NCCL for CUDA ones), whose
    collectives each raise after `timeout_s`; returns `tp`. `name` keeps the rendezvous of one group apart
    from another's on the same store (a pipeline stage's tensor-parallel group beside the whole world's)."""
    rank, size, device = tp.rank, tp.size, tp.device
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.PrefixStore(name, store)
    if device.type == "cuda":  # NCCL's watchdog applies the group timeout to every collective, idle waits too
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = IDLE
        pg = dist.ProcessGroupNCCL(store, rank, size, opts)
    else:
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        pg = dist.ProcessGroupGloo(store, rank, size, opts)
    tp.pg, tp.timeout = pg, timeout
    return tp


def from_default_group(device: torch.device, timeout_s: float) -> TPGroup:
    """The group of a launcher such as torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set): the
    default process group, initialised here if the program has not done it."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s))
    return TPGroup(dist.get_rank(), dist.get_world_size(), dist.distributed_c10d._get_default_group(), device,
                   datetime.timedelta(seconds=timeout_s))
