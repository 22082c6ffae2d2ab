"""Tensor-parallel ranks as threads of this process (gloo over an in-process store): each rank's model shard
runs the same steps, so sharded forwards can be compared with the unsharded one without spawning."""
from __future__ import annotations

import datetime
import threading
from typing import Any, Callable

import torch.distributed as dist

from hybridcache.parallel import TPGroup


def on_thread_ranks(size: int, fn: Callable[[TPGroup], Any], timeout_s: float = 60.0) -> list[Any]:
    """fn(group) on `size` threads, one per rank; returns the results by rank (re-raises the first error)."""
    store, results, errors = dist.HashStore(), [None] * size, [None] * size

    def run(rank: int) -> None:
        try:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = datetime.timedelta(seconds=timeout_s)
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            pg = dist.ProcessGroupGloo(dist.PrefixStore("t", store), rank, size, opts)
            results[rank] = fn(TPGroup(rank, size, pg))
        except BaseException as e:  # reported below
            errors[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * 2)
    for e in errors:
        if e is not None:
            raise e
    return results
