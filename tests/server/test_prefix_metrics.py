"""Prefix caching through the server: `hybridcache serve --enable-prefix-caching` builds an LLM with it on,
and /metrics reports the prefix-cache counters and gauges with the LLM's own values."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("openai")
import httpx  # noqa: E402

from hybridcache import LLM  # noqa: E402
from tests.models.helpers import save_tiny  # noqa: E402
from tests.server.helpers import serve  # noqa: E402
from tests.server.test_server import metrics_of  # noqa: E402

SHARED = [(7 * i + 3) % 90 + 3 for i in range(24)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path, _ = save_tiny(tmp_path_factory.mktemp("tiny"))
    return path


def test_serve_flag_turns_prefix_caching_on(tiny, monkeypatch):
    import hybridcache.server.app as app
    from hybridcache.cli import main

    built = []
    monkeypatch.setattr(app, "serve", lambda llm, *a, **kw: built.append(llm))
    assert main(["serve", str(tiny), "--enable-prefix-caching", "--max-model-len", "64"]) == 0
    assert main(["serve", str(tiny), "--max-model-len", "64"]) == 0
    assert [llm.manager.planner.prefix is not None for llm in built] == [True, False]


def test_metrics_report_the_prefix_cache_counters(tiny):
    llm = LLM(tiny, page_size=4, max_model_len=64, enable_prefix_caching=True, prefix_snapshot_interval=8)
    with serve(llm) as srv:
        client = srv.openai()
        for tail in ([5, 6, 7], [9, 10, 11, 12]):  # the second starts from the first one's snapshot at 24
            client.completions.create(model="m", prompt=SHARED + tail, max_tokens=3, temperature=0)
        srv.wait_idle()
        got = metrics_of(httpx.get(srv.base + "/metrics").text)
    s = llm.stats
    assert s.prefix_cache_hits == 24 and s.prefix_cache_queries == 27 + 28 and s.num_snapshots > 0
    want = {"hybridcache:prefix_cache_queries_total": s.prefix_cache_queries,
            "hybridcache:prefix_cache_hits_total": s.prefix_cache_hits,
            "hybridcache:prefix_cache_evictions_total": s.prefix_cache_evictions,
            "hybridcache:prefix_cache_snapshots_saved_total": s.num_snapshots_saved,
            "hybridcache:prefix_cache_snapshots": s.num_snapshots,
            "hybridcache:prefix_cache_snapshot_bytes": s.snapshot_bytes}
    assert {k: got.get(k) for k in want} == want
