"""A prefill/decode pair behind one front door, the decode server (`hybridcache serve --role decode`): it takes
the OpenAI API and /metrics, sends each new request's prompt to the prefill server over the link, gets the
prefilled request back (first token sampled, state in the unsharded layout) and decodes it. vLLM's proxy
that routes prefill then decode, folded into the decode server.

```
client ─HTTP─▶ decode server (RemotePrefill over its LLM, EngineCore, FastAPI)
                  │ (PREFILL, tag, prompt ids, params, seed)            ▲ (REQUEST meta+tag, records)
                  ▼                                                     │ (FINISHED, output, tag)
               prefill server (PrefillServer over its LLM: add_request -> prefill -> take_prefilled)
```
"""
from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
from typing import Any, Sequence

from ..cache import HostTierFullError
from ..engine.llm import LLM
from ..engine.params import SamplingParams
from ..engine.request import RequestDelta, RequestOutput
from .channel import KVChannel
from .config import KVTransferConfig
from .consumer import KVConsumer
from .producer import END, KVProducer

PREFILL = "prefill"


class PrefillServer:
    """The prefill side: prefills what the decode server sends and sends each request back once its first
    token is sampled. `serve()` runs until the decode server ends the pair (END) and returns; a dead or
    hung decode server raises KVTransferError."""

    def __init__(self, llm: LLM, link: KVChannel | KVTransferConfig) -> None:
        self.llm = llm
        self.producer = KVProducer(llm, link)  # the handshake
        self.channel = self.producer.channel
        self.ended = False
        self._inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._receive, name="hybridcache-prefill-recv", daemon=True).start()

    def serve(self) -> None:
        llm, tags = self.llm, {}  # request id here -> the decode server's tag
        while True:
            for msg in self._take(block=not llm.has_unfinished()):
                if msg[0] == END:
                    self.ended = True
                    return
                _, tag, ids, params, seed = msg
                try:
                    tags[llm.add_request(ids, dataclasses.replace(params, seed=seed))] = tag
                except Exception:  # checked alike at the front door; refused here all the same
                    self.producer._send_finished(RequestOutput(-1, ids, [], None, "abort", None), tag)
            if not llm.has_unfinished():
                continue
            for out in llm.step():  # ended at its first token
                if out.request_id in tags:
                    self.producer._send_finished(out, tags.pop(out.request_id))
            for rid in list(tags):
                if (ready := llm.take_prefilled(rid)) is not None:
                    self.producer._send(ready, tags.pop(rid))

    def _take(self, block: bool) -> list:
        items = [self._inbox.get()] if block else []
        while not self._inbox.empty():
            items.append(self._inbox.get_nowait())
        for item in items:
            if isinstance(item, BaseException):
                raise item
        return items

    def _receive(self) -> None:
        try:
            while True:
                msg = self.channel.recv_object(idle=True)
                self._inbox.put(msg)
                if msg[0] == END:
                    return
        except BaseException as e:
            self._inbox.put(e)

    def close(self) -> None:
        """Drop the link (telling the decode server first, unless it ended the pair)."""
        if self.ended:
            self.producer.channel.close()
        else:
            self.producer.close()


class RemotePrefill:
    """The decode engine as the front door: the `LLM` surface an `EngineCore` drives (add_request, step,
    abort_request, take_deltas, ...), whose prompts are prefilled by the `PrefillServer` at the other end
    of `link`. Request ids are this object's; everything else reads the decode `llm`. A request aborted
    while at the prefill server is dropped when it comes back."""

    def __init__(self, llm: LLM, link: KVChannel | KVTransferConfig) -> None:
        self.__dict__.update(llm=llm, consumer=KVConsumer(llm, link), _ids=itertools.count(), _pending={},
                             _outer={}, _backlog=[], _deltas=[], _ready=[])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.llm, name, value)  # stream_deltas, step_hook: the decode LLM's

    def add_request(self, prompt: Sequence[int] | str, params: SamplingParams | None = None) -> int:
        params = params or self.llm.default_params
        ids = self.llm.check_request(prompt, params)
        wid = next(self._ids)
        seed = params.seed if params.seed is not None else self.llm.seed * 1_000_003 + wid
        self.consumer.channel.send_object((PREFILL, wid, ids, params, seed))
        self._pending[wid] = len(ids)
        return wid

    def has_unfinished(self) -> bool:
        return bool(self._pending) or self.llm.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Add what came back from the prefill server (waiting briefly when nothing else runs), then one step."""
        llm = self.llm
        for item in self.consumer._take(block=not llm.has_unfinished() and not self._backlog, timeout=0.05):
            wid = self.consumer.tags.pop(id(item))
            if self._pending.pop(wid, None) is None:
                self.consumer._rest.pop(id(item), None)  # aborted meanwhile
            elif isinstance(item, RequestOutput):
                self._finished_there(wid, item)
            else:
                self._backlog.append((wid, item))
        while self._backlog:
            wid, p = self._backlog[0]
            try:
                self._outer[self.consumer._add(p)] = wid
            except HostTierFullError:
                if not llm.has_unfinished():
                    raise
                break
            self.consumer._rest.pop(id(self._backlog.pop(0)[1]), None)
        outs = llm.step() if llm.has_unfinished() else []
        ready, self.__dict__["_ready"] = self._ready, []
        # with deltas on, the finished delta (taken after this) forgets the id
        forget = self._outer.get if self.llm.stream_deltas else self._outer.pop
        return ready + [dataclasses.replace(o, request_id=forget(o.request_id)) for o in outs]

    def abort_request(self, request_id: int) -> None:
        n = self._pending.pop(request_id, None)
        if n is not None:
            if self.llm.stream_deltas:
                self._deltas.append(RequestDelta(request_id, [], "" if self.llm.tokenizer else None, "abort", None, n, 0))
            return
        inner = next((r for r, w in self._outer.items() if w == request_id), None)
        if inner is not None:
            self.llm.abort_request(inner)
            if not self.llm.stream_deltas:
                del self._outer[inner]

    def take_deltas(self) -> list[RequestDelta]:
        deltas, self.__dict__["_deltas"] = self._deltas, []
        for d in self.llm.take_deltas():
            wid = self._outer[d.request_id]
            if d.finished:
                self._outer.pop(d.request_id)
            deltas.append(dataclasses.replace(d, request_id=wid))
        return deltas

    def _finished_there(self, wid: int, out: RequestOutput) -> None:
        out = dataclasses.replace(out, request_id=wid)
        self._ready.append(out)
        if self.llm.stream_deltas:
            self._deltas.append(RequestDelta(wid, list(out.token_ids), out.text, out.finish_reason, out.logprobs,
                                             len(out.prompt_token_ids), len(out.token_ids)))

    def close(self) -> None:
        """End the pair: the prefill server's `serve()` returns."""
        if self.consumer.channel.failure is None:
            self.consumer.channel.send_object((END,))
        self.consumer.close()
