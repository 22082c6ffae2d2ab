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
from .layout import cache_layout, mismatch
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
        why = mismatch(cache_layout(llm), self.channel.recv_object())
        self.channel.send_object(why)
        if why is not None:
            raise TransferLayoutError(why)
        self._inbox: queue.Queue = queue.Queue()
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
                if not isinstance(item, RequestOutput):
                    backlog.append(item)
            while backlog:
                try:
                    rid_of[id(backlog[0])] = llm.add_prefilled(backlog[0])
                except HostTierFullError:
                    if not llm.has_unfinished():  # nothing will free a host slot
                        raise
                    break
                backlog.pop(0)
            if llm.has_unfinished():
                for out in llm.step():
                    done[out.request_id] = out
        return [a if isinstance(a, RequestOutput) else done[rid_of[id(a)]] for a in arrivals]

    def _take(self, block: bool) -> list[PrefilledRequest | RequestOutput]:
        """What arrived (waiting for one message when `block`); raises the receiver's error."""
        items = []
        try:
            items.append(self._inbox.get(block=block))
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
                    self._inbox.put(msg[1])
                    continue
                assert msg[0] == REQUEST, msg[0]
                meta = msg[1]
                host = self.llm.manager.host_tier
                slot = torch.empty(host.slot_layout.nbytes, dtype=torch.uint8)
                pages = torch.empty(meta["pages"], host.page_layout.nbytes, dtype=torch.uint8)
                self.channel.recv(slot)
                self.channel.recv(pages)
                self._inbox.put(PrefilledRequest(meta["prompt"], meta["output"], meta["params"], meta["seed"],
                                                 slot, pages, meta["logprobs"]))
        except BaseException as e:  # KVTransferError from the channel, or anything unexpected
            self._inbox.put(e)

    def close(self) -> None:
        """Drop the link if this consumer made it (a channel passed in stays open for the next pair)."""
        if self._owns_link:
            self.channel.close()
