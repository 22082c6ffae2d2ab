"""A server on 127.0.0.1 with an ephemeral port, in a thread; checkpoints for the server tests."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hybridcache import LLM


class HeldSteps:
    """A step hook that holds the core's thread after each step until `release()`: whatever is live when it
    holds stays live, however slow or loaded the machine. `held` is set once the core is held."""

    def __init__(self) -> None:
        self.held, self._go = threading.Event(), threading.Event()

    def __call__(self) -> None:
        self.held.set()
        assert self._go.wait(60), "the test never released the core"

    def release(self) -> None:
        self._go.set()


def until(cond, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what or cond}"
        time.sleep(0.01)


class Running:
    def __init__(self, app, llm: LLM, base: str) -> None:
        self.app, self.llm, self.base = app, llm, base
        self.core = app.state.core

    def openai(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=60, **kw)

    def async_openai(self):
        import openai

        return openai.AsyncOpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=60)

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Until the core holds no request and has stepped past the last one (then its thread waits on
        its inbox and the LLM may be read from here)."""
        deadline = time.monotonic() + timeout
        while self.core.num_live or self.llm.has_unfinished():
            assert time.monotonic() < deadline, f"{self.core.num_live} requests still live"
            time.sleep(0.02)
        time.sleep(0.1)


@contextmanager
def serve(llm: LLM, name: str = "m", max_queued: int | None = None) -> Iterator[Running]:
    import uvicorn

    from hybridcache.server.app import build_app

    app = build_app(llm, name, max_queued=max_queued)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Running(app, llm, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


def default_checkpoint(home: Path) -> Path:
    """The embedded default, built under `home` (HYBRIDCACHE_HOME)."""
    import os

    from hybridcache.cli import default_model_dir, ensure_default_model

    old = os.environ.get("HYBRIDCACHE_HOME")
    os.environ["HYBRIDCACHE_HOME"] = str(home)
    try:
        return ensure_default_model(default_model_dir())
    finally:
        if old is None:
            del os.environ["HYBRIDCACHE_HOME"]
        else:
            os.environ["HYBRIDCACHE_HOME"] = old
