"""`max_queued` is exact: a request counts from the moment `open()`/`submit()` accepts it until the core has
finished or aborted it and its reader has taken the last delta or gone. Every ordering below is forced by
holding the core's thread in a step hook (`HeldSteps`) or the event loop, never by timing."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
import httpx  # noqa: E402

from hybridcache import LLM, SamplingParams  # noqa: E402
from hybridcache.engine.core import EngineCore, QueueFullError  # noqa: E402
from tests.models.helpers import save_tiny  # noqa: E402
from tests.server.helpers import HeldSteps, serve, until  # noqa: E402
from tests.server.test_server import assert_idle_and_empty, metrics_of  # noqa: E402

IDS = [5, 17, 3, 42, 8, 8, 13, 21]
P = SamplingParams(max_tokens=2, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path, _ = save_tiny(tmp_path_factory.mktemp("tiny"))
    return path


def test_core_counts_a_request_until_every_holder_lets_go(tiny):
    llm = LLM(tiny)
    core = EngineCore(llm, max_queued=1).start()
    try:
        with pytest.raises(ValueError, match="holders"):
            core.submit(IDS, P, lambda d: None, holders=0)
        done = threading.Event()
        ticket = core.submit(IDS, P, lambda d: d.finished and done.set(), holders=2)
        assert done.wait(30)  # the core let go before it handed over the last delta
        assert core.num_live == 1
        with pytest.raises(QueueFullError):
            core.submit(IDS, P, lambda d: None)
        core.let_go(ticket)
        assert core.num_live == 0
        done.clear()
        core.submit(IDS, P, lambda d: d.finished and done.set())  # one holder: the core
        assert done.wait(30) and core.num_live == 0
    finally:
        core.shutdown()
    assert_idle_and_empty(llm)


def test_a_stream_counts_from_open_until_its_reader_has_the_last_delta_or_the_abort_lands(tiny):
    llm = LLM(tiny)
    core = EngineCore(llm, max_queued=2).start()

    def finished_in_the_core() -> bool:  # the snapshot is taken after the step's deltas are handed over
        return core.snapshot.stats.get("num_generated_tokens", 0) == 2 + 2

    async def main() -> None:
        a = core.open(IDS, P)
        b = core.open(IDS, P)  # counted from open(), before the core has seen it
        with pytest.raises(QueueFullError):
            core.open(IDS, P)
        # block the event loop until the core has finished both: their last deltas wait, undelivered
        until(finished_in_the_core, what="both requests to finish in the core")
        assert core.num_live == 2
        with pytest.raises(QueueFullError):
            core.open(IDS, P)
        deltas = []
        while not a.finished:  # a reader that takes the last delta and never calls close()
            deltas.append(await a.next())
        assert sum(len(d.token_ids) for d in deltas) == 2 and deltas[-1].finish_reason == "length"
        assert core.num_live == 1
        b.close()  # its last delta is never read: closing gives its place back
        assert core.num_live == 0

        llm.step_hook = hold = HeldSteps()
        c = core.open(IDS, SamplingParams(max_tokens=50, ignore_eos=True))
        assert await asyncio.to_thread(hold.held.wait, 30)
        c.close()  # the abort waits in the core's inbox while the core is held: c still holds its state
        assert core.num_live == 1
        hold.release()
        await asyncio.to_thread(until, lambda: core.num_live == 0)

    try:
        asyncio.run(main())
    finally:
        core.shutdown()
    assert_idle_and_empty(llm)
    assert llm.stats.num_generated_tokens < 2 + 2 + 50  # c was aborted


def test_a_client_that_leaves_while_held_keeps_its_place_until_the_abort_lands(tiny):
    llm = LLM(tiny)
    llm.step_hook = hold = HeldSteps()
    with serve(llm, "tiny", max_queued=1) as srv:
        url = srv.base + "/v1/completions"
        body = {"prompt": IDS, "max_tokens": 50, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", url, json=body) as first:
                assert first.status_code == 200 and hold.held.wait(30)
        until(lambda: metrics_of(httpx.get(srv.base + "/metrics").text).get(
            "hybridcache:request_success_total{finished_reason=abort}") == 1, what="the server to see the client go")
        resp = httpx.post(url, json={"prompt": IDS, "max_tokens": 2})
        assert resp.status_code == 503 and srv.core.num_live == 1  # the core, held, has not aborted it yet
        hold.release()
        srv.wait_idle()
        assert_idle_and_empty(llm)
        assert llm.stats.num_generated_tokens < 50
        resp = httpx.post(url, json={"prompt": IDS, "max_tokens": 2})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2


def test_a_stalled_client_that_leaves_is_aborted_when_the_response_ends(tiny):
    """The client stops reading (the server's write of the first chunk never completes), then leaves: the
    response is cancelled while its body generator waits at a `yield`, where no `finally` of the generator
    runs; the response itself must abort the request and give its place back before it returns."""
    llm = LLM(tiny)
    with serve(llm, "tiny", max_queued=1) as srv:
        raw = json.dumps({"prompt": IDS, "max_tokens": 2000, "ignore_eos": True, "stream": True}).encode()
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]}

        async def main() -> tuple[list[dict], dict[str, float]]:
            body_given, gone, sent = [], asyncio.Event(), []

            async def receive() -> dict:
                if not body_given:
                    body_given.append(True)
                    return {"type": "http.request", "body": raw, "more_body": False}
                await gone.wait()
                return {"type": "http.disconnect"}

            async def send(message: dict) -> None:
                sent.append(message)
                if message["type"] == "http.response.body":
                    gone.set()
                    await asyncio.Event().wait()  # never written: the client stopped reading

            await srv.app(scope, receive, send)
            m = metrics_of(httpx.get(srv.base + "/metrics").text)  # before the loop runs anything else
            await asyncio.to_thread(srv.wait_idle)  # the loop lives on while the core hands it deltas
            return sent, m

        sent, m = asyncio.run(main())
        assert [x["type"] for x in sent] == ["http.response.start", "http.response.body"]
        assert m["hybridcache:request_success_total{finished_reason=abort}"] == 1
        assert_idle_and_empty(llm)
        assert llm.stats.num_generated_tokens < 2000
