"""The engine core: one background thread owns an `LLM` and runs its step loop; other threads (an HTTP
server's event loop, a client) submit requests and aborts through a queue and receive per-step deltas.

Only the core's thread touches the LLM. A submission's sink (`on_delta`) is called on that thread, once per
step that gave the request anything and a last time with its finish reason ('stop', 'length', 'abort');
`open()` turns that into an async iterator for asyncio code (via `loop.call_soon_threadsafe`). While the
core runs it holds the LLM's generate lock, so `LLM.generate()` from another thread is refused.

`max_queued` counts a request from the moment `submit()`/`open()` accepts it until the core has finished or
aborted it and, for `open()`, its reader has taken the last delta or closed the stream: each holder lets go
of its ticket once, and the ticket leaves the count when the last one has.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Sequence

from .errors import InvalidRequestError
from .llm import LLM
from .params import SamplingParams
from .request import RequestDelta

log = logging.getLogger(__name__)
Sink = Callable[[RequestDelta], None]


class QueueFullError(RuntimeError):
    """The core already holds `max_queued` unfinished requests; nothing was queued."""


class EngineStoppedError(RuntimeError):
    """The core is not running."""


@dataclass
class Snapshot:
    """What the core's thread last saw of the LLM, for readers on other threads (metrics)."""

    num_running: int = 0
    num_waiting: int = 0
    num_suspended: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    pools: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (owned, total)
    device_bytes_used: int = 0
    device_bytes: int = 1


class EngineCore:
    def __init__(self, llm: LLM, max_queued: int | None = None) -> None:
        if max_queued is not None and max_queued < 1:
            raise ValueError(f"max_queued must be >= 1 or None, got {max_queued}")
        self.llm = llm
        self.max_queued = max_queued
        self._inbox: queue.Queue = queue.Queue()
        self._tickets = itertools.count()
        self._lock = threading.Lock()  # guards _holds
        self._holds: dict[int, int] = {}  # ticket -> holders not yet let go (the core; a DeltaStream's reader)
        self._sinks: dict[int, Sink] = {}  # llm request id -> sink (core thread only)
        self._rid_of: dict[int, int] = {}  # ticket -> llm request id (core thread only)
        self._ticket_of: dict[int, int] = {}  # llm request id -> ticket
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.snapshot = Snapshot()
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ any thread
    def start(self) -> "EngineCore":
        if not self.llm._generate_lock.acquire(blocking=False):
            raise InvalidRequestError("this LLM is busy (generate() or another engine core is running it)")
        self.llm.stream_deltas = True
        self._thread = threading.Thread(target=self._run, name="hybridcache-core", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort every live request, stop the thread and hand the LLM back."""
        if self._thread is None:
            return
        self._stop.set()
        self._inbox.put(("wake", None, None))
        self._thread.join(timeout)
        self._thread = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def num_live(self) -> int:
        """Requests counted against `max_queued` (see the module's docstring)."""
        return len(self._holds)

    def submit(self, prompt: Sequence[int] | str, params: SamplingParams, on_delta: Sink, holders: int = 1) -> int:
        """Queue a request; returns its ticket (for `abort`). The prompt is checked here: InvalidRequestError
        (or RequestTooLargeError) reaches the caller and nothing is queued; QueueFullError when full.
        The request counts against `max_queued` until the core has let go of it (finished or aborted) and
        so have `holders - 1` callers of `let_go(ticket)`."""
        if holders < 1:
            raise ValueError(f"holders must be >= 1 (the core is one), got {holders}")
        if self._thread is None or self._stop.is_set():
            raise EngineStoppedError("the engine core is not running")
        ids = self.llm.check_request(prompt, params)
        with self._lock:
            if self.max_queued is not None and len(self._holds) >= self.max_queued:
                raise QueueFullError(f"the server holds {len(self._holds)} requests, its limit (--max-queued)")
            ticket = next(self._tickets)
            self._holds[ticket] = holders
        self._inbox.put(("add", ticket, (ids, params, on_delta)))
        return ticket

    def let_go(self, ticket: int) -> None:
        """One holder of the ticket is done with it; the last one ends its count. Call once per holder."""
        with self._lock:
            left = self._holds.pop(ticket) - 1
            if left:
                self._holds[ticket] = left

    def abort(self, ticket: int) -> None:
        """Stop the request and free its state at once (on the core's next turn); its sink gets a last
        delta with finish reason 'abort'. Finished or unknown tickets are ignored."""
        self._inbox.put(("abort", ticket, None))

    def open(self, prompt: Sequence[int] | str, params: SamplingParams) -> "DeltaStream":
        """Submit now (errors reach the caller) and read the deltas with `async for`; call from asyncio."""
        return DeltaStream(self, prompt, params)

    # ------------------------------------------------------------------ the core's thread
    def _run(self) -> None:
        llm = self.llm
        try:
            while not self._stop.is_set():
                self._drain(block=not llm.has_unfinished())
                if self._stop.is_set() or not llm.has_unfinished():
                    continue
                try:
                    llm.step()
                except Exception as e:  # the LLM restarted the step's rows; end every request rather than loop
                    log.exception("engine step failed; aborting %d requests", len(self._sinks))
                    self.error = e
                    for rid in list(self._sinks):
                        llm.abort_request(rid)
                self._route(llm.take_deltas())
                self._take_snapshot()
        finally:
            self._drain(block=False)
            for rid in list(self._sinks):
                llm.abort_request(rid)
            self._route(llm.take_deltas())
            self._take_snapshot()
            llm.stream_deltas = False
            llm._generate_lock.release()

    def _drain(self, block: bool) -> None:
        """Apply queued submissions and aborts (waiting briefly for one when the LLM is idle)."""
        while True:
            try:
                kind, ticket, payload = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if kind == "add":
                ids, params, sink = payload
                try:
                    rid = self.llm.add_request(ids, params)
                except Exception as e:  # checked at submit; a refusal here ends the request
                    log.warning("request refused in the core: %s", e)
                    self.let_go(ticket)
                    sink(RequestDelta(-1, [], None, "abort", None, len(ids), 0))
                    continue
                self._sinks[rid], self._rid_of[ticket], self._ticket_of[rid] = sink, rid, ticket
            elif kind == "abort":
                rid = self._rid_of.get(ticket)
                if rid is not None:
                    self.llm.abort_request(rid)
                    self._route(self.llm.take_deltas())
                    self._take_snapshot()

    def _route(self, deltas: list[RequestDelta]) -> None:
        for d in deltas:
            sink = self._sinks.get(d.request_id)
            if sink is None:
                continue
            if d.finished:
                del self._sinks[d.request_id]
                ticket = self._ticket_of.pop(d.request_id)
                del self._rid_of[ticket]
                self.let_go(ticket)
            try:
                sink(d)
            except Exception:  # a consumer's failure must not stop the engine
                log.exception("a delta sink failed")

    def _take_snapshot(self) -> None:
        llm, sched = self.llm, self.llm.scheduler
        planner = llm.manager.planner
        pools = {name: (getattr(planner, name).num_owned, getattr(planner, name).total)
                 for name in ("slot_pool", "page_pool", "host_slot_pool", "host_page_pool")}
        sizing = llm.sizing
        used = pools["slot_pool"][0] * sizing.bytes_per_slot + pools["page_pool"][0] * sizing.bytes_per_page
        s = llm.stats
        self.snapshot = Snapshot(len(sched.running), len(sched.waiting), len(sched.suspended),
                                 {k: getattr(s, k) for k in vars(s)}, pools, used,
                                 max(llm.manager.config.device_bytes, 1))



class DeltaStream:
    """One request's deltas for asyncio code: the core's thread hands each one to the event loop with
    `call_soon_threadsafe`. Leaving `async for` early (a cancelled task, a closed client) or `close()`
    aborts the request, freeing its state. The reader holds the request's place under `max_queued` until
    it takes the last delta or calls `close()`; a reader that may stop early must call `close()`."""

    def __init__(self, core: EngineCore, prompt: Sequence[int] | str, params: SamplingParams) -> None:
        loop = asyncio.get_running_loop()
        self._core = core
        self._queue: asyncio.Queue[RequestDelta] = asyncio.Queue()
        self.finished = False
        ids = core.llm.check_request(prompt, params)
        self.num_prompt_tokens = len(ids)
        self.ticket = core.submit(ids, params, lambda d: loop.call_soon_threadsafe(self._queue.put_nowait, d),
                                  holders=2)
        self._holding = True

    async def next(self) -> RequestDelta:
        delta = await self._queue.get()
        if delta.finished:
            self.finished = True
            self._let_go()
        return delta

    async def __aiter__(self) -> AsyncIterator[RequestDelta]:
        try:
            while not self.finished:
                yield await self.next()
        finally:
            self.close()

    def close(self) -> None:
        if not self.finished:
            self.finished = True
            self._core.abort(self.ticket)
        self._let_go()

    def _let_go(self) -> None:
        if self._holding:
            self._holding = False
            self._core.let_go(self.ticket)
