"""Prometheus metrics, named like vLLM's under our prefix, in a registry of their own per app.

Per-request counters and latency histograms are observed by the server as deltas arrive; engine gauges
and the cache's cumulative counters are read at scrape time from the core's snapshot (taken on the core's
thread after each step, so a scrape never touches the LLM)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine.core import EngineCore

P = "hybridcache:"
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0)
# stats field -> (metric name without _total, help)
ENGINE_COUNTERS = {
    "num_suspensions": ("num_suspensions", "Requests suspended to the host tier"),
    "num_resumes": ("num_resumes", "Suspended requests resumed on the device"),
    "num_reprefills": ("num_reprefills", "Requests whose state was dropped and rebuilt from their tokens"),
    "num_rebalances": ("num_rebalances", "Re-splits of the device cache between slots and pages"),
    "bytes_to_host": ("bytes_to_host", "Bytes copied from the device to the host tier"),
    "bytes_to_device": ("bytes_to_device", "Bytes copied from the host tier to the device"),
    "num_steps": ("num_steps", "Engine steps run"),
    "step_seconds": ("engine_step_seconds", "Wall time of committed engine steps"),
    "num_draft_tokens": ("spec_decode_num_draft_tokens", "Speculative tokens proposed"),
    "num_accepted_tokens": ("spec_decode_num_accepted_tokens", "Speculative tokens accepted"),
    "num_aborted_rows": ("num_aborted_rows", "Rows of failed steps restarted from their tokens"),
    "prefix_cache_queries": ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache at admission"),
    "prefix_cache_hits": ("prefix_cache_hits", "Prompt tokens found in the prefix cache at admission"),
    "prefix_cache_evictions": ("prefix_cache_evictions", "Prefix-cache snapshots evicted to make room"),
    "num_snapshots_saved": ("prefix_cache_snapshots_saved", "Prefix-cache snapshots saved"),
    "prefix_cache_spills": ("prefix_cache_spills", "Prefix-cache snapshots moved to the host tier (with their chains' pages)"),
    "prefix_cache_host_hits": ("prefix_cache_host_hits", "Admissions whose cached prefix came back from the host tier"),
}
# stats field -> (gauge name, help)
ENGINE_GAUGES = {
    "num_snapshots": ("prefix_cache_snapshots", "Prefix-cache recurrent snapshots held"),
    "snapshot_bytes": ("prefix_cache_snapshot_bytes", "Device bytes of the prefix-cache snapshots held"),
}
POOLS = {"slot_pool": "device_slots", "page_pool": "device_pages", "host_slot_pool": "host_slots",
         "host_page_pool": "host_pages"}


class _EngineCollector:
    def __init__(self, core: EngineCore, model_name: str) -> None:
        self.core, self.model_name = core, model_name

    def collect(self):
        snap, labels = self.core.snapshot, ["model_name"]
        value = [self.model_name]

        def gauge(name: str, help: str, v: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(P + name, help, labels=labels)
            g.add_metric(value, v)
            return g

        yield gauge("num_requests_running", "Requests holding device state", snap.num_running)
        yield gauge("num_requests_waiting", "Requests waiting for their first step or to resume",
                    snap.num_waiting + snap.num_suspended)
        yield gauge("num_requests_suspended", "Requests suspended to the host tier", snap.num_suspended)
        yield gauge("kv_cache_usage_perc", "Fraction of the device cache (slots and pages) held by requests",
                    snap.device_bytes_used / snap.device_bytes)
        for pool, name in POOLS.items():
            owned, total = snap.pools.get(pool, (0, 0))
            yield gauge(f"{name}_used", f"{name.replace('_', ' ')} held by requests", owned)
            yield gauge(f"{name}_total", f"{name.replace('_', ' ')} in the pool", total)
        host_owned = sum(snap.pools.get(p, (0, 0))[0] for p in ("host_slot_pool", "host_page_pool"))
        host_total = sum(snap.pools.get(p, (0, 0))[1] for p in ("host_slot_pool", "host_page_pool"))
        yield gauge("host_cache_usage_perc", "Fraction of host-tier slots and pages held",
                    host_owned / host_total if host_total else 0.0)
        for field, (name, help) in ENGINE_GAUGES.items():
            yield gauge(name, help, snap.stats.get(field, 0))
        for field, (name, help) in ENGINE_COUNTERS.items():
            c = CounterMetricFamily(P + name, help, labels=labels)
            c.add_metric(value, snap.stats.get(field, 0))
            yield c


class Metrics:
    def __init__(self, core: EngineCore, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name}
        names = ["model_name"]
        r = self.registry
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of finished requests", names, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens", names, registry=r)
        self.request_success = Counter(P + "request_success", "Finished requests by finish reason",
                                       names + ["finished_reason"], registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time to the first token", names,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Time between token deliveries", names,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Arrival to finish", names,
                             buckets=LATENCY_BUCKETS, registry=r)
        r.register(_EngineCollector(core, model_name))
        for c in (self.prompt_tokens, self.generation_tokens):
            c.labels(**self.labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Observes one request's latencies and token counts as its deltas arrive; a request whose client
    left counts as finished with reason 'abort' when its stream closes."""

    def __init__(self, metrics: Metrics, arrival: float, num_prompt_tokens: int) -> None:
        self.m, self.arrival, self.last = metrics, arrival, None
        self.num_prompt_tokens, self.done = num_prompt_tokens, False

    def observe(self, delta, now: float) -> None:
        m, labels = self.m, self.m.labels
        if delta.token_ids:
            if self.last is None:
                m.ttft.labels(**labels).observe(now - self.arrival)
            else:
                m.itl.labels(**labels).observe(now - self.last)
            self.last = now
            m.generation_tokens.labels(**labels).inc(len(delta.token_ids))
        if delta.finished:
            self.finish(delta.finish_reason, now)

    def finish(self, reason: str, now: float) -> None:
        if self.done:
            return
        self.done = True
        m, labels = self.m, self.m.labels
        m.prompt_tokens.labels(**labels).inc(self.num_prompt_tokens)
        m.request_success.labels(**labels, finished_reason=reason).inc()
        m.e2e.labels(**labels).observe(now - self.arrival)
