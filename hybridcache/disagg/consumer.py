"""`KVConsumer`: the decode side of a pair. A receiver thread takes the producer's requests off the link; the
caller's thread adds each to the engine as a suspended request (between steps) and decodes."""
from __future__ import annotations

import queue
import threading

import torch

from ..cache import HostTierFullError
from ..engine.llm import LLM
from ..engine.prefilled import PrefilledRequest
from ..engine.request import RequestOutput
from .channel import KVChannel
from .config import KVTransferConfig
from .errors import KVTransferError, TransferLayoutError
from .layout import cache_layout, mismatch, resharder
from .producer import END, FINISHED, REQUEST


class KVConsumer:
    """Receives from a `KVProducer` over `channel` (or one made from a consumer `KVTransferConfig`); the
    handshake refuses a producer whose cache layout differs (TransferLayoutError on both sides).
    `generate()` decodes everything the producer sends until it closes; a dead or hung producer raises
    KVTransferError at the caller."""

    def __init__(self, llm: LLM, link: KVChannel | KVTransferConfig) -> None:
        self.llm = llm
        self._owns_link = not isinstance(link, KVChannel)
        self.channel = KVChannel(link) if self._owns_link else link
        if self.channel.config.is_producer:
            raise ValueError("a KVConsumer needs a kv_consumer link")
        self.reshard = resharder(llm)
        why = mismatch(cache_layout(llm, self.reshard), self.channel.recv_object())
        self.channel.send_object(why)
        if why is not None:
            raise TransferLayoutError(why)
        self._inbox: queue.Queue = queue.Queue()
        self._rest: dict[int, list] = {}  # id(arrival) -> the other ranks' records (tensor-parallel engines)
        self.tags: dict[int, object] = {}  # id(arrival) -> the tag its producer gave it (`remote.RemotePrefill`)
        self._thread = threading.Thread(target=self._receive, name="hybridcache-kv-recv", daemon=True)
        self._thread.start()
        self.ended = False
        self.num_received = 0

    def generate(self) -> list[RequestOutput]:
        """Decode every request the producer sends, until it closes; outputs in the order it sent them. A
        request that finds the host tier full waits (in arrival order) until resumes free a host slot."""
        arrivals: list[PrefilledRequest | RequestOutput] = []  # an output: it ended at the producer
        rid_of: dict[int, int] = {}  # id(arrival) -> request id here
        done: dict[int, RequestOutput] = {}
        backlog: list[PrefilledRequest] = []
        llm = self.llm
        while not self.ended or backlog or llm.has_unfinished():
            for item in self._take(block=not (backlog or llm.has_unfinished())):
                arrivals.append(item)
                self.tags.pop(id(item), None)
                if not isinstance(item, RequestOutput):
                    backlog.append(item)
            while backlog:
                try:
                    rid_of[id(backlog[0])] = self._add(backlog[0])
                except HostTierFullError:
                    if not llm.has_unfinished():  # nothing will free a host slot
                        raise
                    break
                self._rest.pop(id(backlog.pop(0)), None)
            if llm.has_unfinished():
                for out in llm.step():
                    done[out.request_id] = out
        return [a if isinstance(a, RequestOutput) else done[rid_of[id(a)]] for a in arrivals]

    def _add(self, p: PrefilledRequest) -> int:
        """`add_prefilled`; on a tensor-parallel engine the workers' shards go along (the store scatters them)."""
        if self.reshard.size == 1:
            return self.llm.add_prefilled(p)
        store = self.llm.manager.store
        store.to_scatter = self._rest[id(p)]
        try:
            return self.llm.add_prefilled(p)
        finally:
            store.to_scatter = None

    def _take(self, block: bool, timeout: float | None = None) -> list[PrefilledRequest | RequestOutput]:
        """What arrived (waiting for one message when `block`, up to `timeout`); raises the receiver's error."""
        items = []
        try:
            items.append(self._inbox.get(block=block, timeout=timeout if block else None))
            while True:
                items.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        out = []
        for item in items:
            if isinstance(item, BaseException):
                raise KVTransferError(str(item)) from item
            if item is END:
                self.ended = True
            else:
                out.append(item)
                self.num_received += 1
        return out

    def _receive(self) -> None:
        """The receiver thread: messages into the inbox until END or a failure (put there too)."""
        try:
            while True:
                msg = self.channel.recv_object(idle=True)
                if msg[0] == END:
                    self._inbox.put(END)
                    return
                if msg[0] == FINISHED:
                    self.tags[id(msg[1])] = msg[2] if len(msg) > 2 else None
                    self._inbox.put(msg[1])
                    continue
                assert msg[0] == REQUEST, msg[0]
                meta, r = msg[1], self.reshard
                slot = torch.empty(r.full_slot.nbytes, dtype=torch.uint8)
                pages = torch.empty(meta["pages"], r.full_page.nbytes, dtype=torch.uint8)
                self.channel.recv(slot)
                self.channel.recv(pages)
                (slot, pages), *rest = r.split((slot, pages))  # this engine's ranks' shards, by head
                p = PrefilledRequest(meta["prompt"], meta["output"], meta["params"], meta["seed"], slot, pages,
                                     meta["logprobs"])
                self._rest[id(p)] = rest
                self.tags[id(p)] = meta.get("tag")
                self._inbox.put(p)
        except BaseException as e:  # KVTransferError from the channel, or anything unexpected
            self._inbox.put(e)

    def close(self) -> None:
        """Drop the link if this consumer made it (a channel passed in stays open for the next pair)."""
        if self._owns_link:
            self.channel.close()
