"""`KVChannel`: the point-to-point link of a prefill/decode pair, a two-rank gloo group (rank 0 the producer)
over a TCPStore. Objects travel pickled (a length, then the bytes), tensors as they are."""
from __future__ import annotations

import datetime
import pickle
from typing import Any, Callable

import torch
import torch.distributed as dist

from .config import KVTransferConfig
from .errors import KVTransferError

IDLE = datetime.timedelta(days=365)


class KVChannel:
    """The producer listens (`port` is the one it got), the consumer connects; both block in the
    constructor until the pair is formed or `kv_timeout_s` passes (KVTransferError); `on_port(port)` runs
    before that wait (a producer given port 0 tells its consumer where to connect). After any failure
    (a dead peer shows at once as a closed connection, a hung one at the timeout) every call raises."""

    def __init__(self, config: KVTransferConfig, on_port: Callable[[int], None] | None = None) -> None:
        self.config = config
        self.rank = 0 if config.is_producer else 1
        self.peer = 1 - self.rank
        self.timeout = datetime.timedelta(seconds=config.kv_timeout_s)
        self.failure: str | None = None
        try:
            self._store = dist.TCPStore(config.kv_ip, config.kv_port, 2, is_master=config.is_producer,
                                        timeout=self.timeout, wait_for_workers=False)
            self.port = self._store.port
            if on_port is not None:
                on_port(self.port)
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = self.timeout
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=config.kv_ip)]
            self.pg = dist.ProcessGroupGloo(dist.PrefixStore("hybridcache_kv", self._store), self.rank, 2, opts)
        except (RuntimeError, dist.DistError) as e:
            raise KVTransferError(f"{config.kv_role} could not form the pair at {config.kv_ip}:{config.kv_port}: {e}") from e

    def send_object(self, obj: Any) -> None:
        data = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
        self.send(torch.tensor([data.numel()], dtype=torch.int64))
        self.send(data)

    def recv_object(self, idle: bool = False) -> Any:
        """The peer's next object; `idle`: wait for it without a bound (a dead peer still ends the wait)."""
        n = torch.zeros(1, dtype=torch.int64)
        self.recv(n, idle)
        buf = torch.empty(int(n.item()), dtype=torch.uint8)
        self.recv(buf)
        return pickle.loads(buf.numpy().tobytes())

    def send(self, t: torch.Tensor) -> None:
        if t.numel():
            self._wait(lambda: self.pg.send([t.contiguous()], self.peer, 0), "sending", self.timeout)

    def recv(self, t: torch.Tensor, idle: bool = False) -> None:
        if t.numel():
            self._wait(lambda: self.pg.recv([t], self.peer, 0), "receiving", IDLE if idle else self.timeout)

    def _wait(self, start, what: str, timeout: datetime.timedelta) -> None:
        if self.failure is not None:
            raise KVTransferError(self.failure)
        try:
            start().wait(timeout)
        except (RuntimeError, dist.DistError) as e:  # gloo: a closed connection or a timeout
            self.failure = f"{self.config.kv_role}: {what} failed (the peer died, hung or closed): {str(e).splitlines()[0]}"
            raise KVTransferError(self.failure) from e

    def close(self) -> None:
        """Drop the group (idempotent); the peer's next operation fails."""
        if self.failure is None:
            self.failure = f"{self.config.kv_role}: the channel is closed"
        self.pg = None
