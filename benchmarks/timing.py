"""Timing for the benchmarks: CUDA events on CUDA, perf_counter on the CPU; medians of repeated runs.

Every figure a benchmark reports is the median of `REPEATS` (at least 5) timed runs that follow untimed
warm-up runs of the same call at the same shapes, so a first call's compilation, autotuning, allocator
growth or CUDA-graph capture is never in a figure.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

REPEATS = 5


class Stopwatch:
    """Marks on one timeline from `start()`: CUDA events on the current stream for a CUDA device (the
    device is synchronised first, so earlier work is not counted), perf_counter otherwise.

    A CUDA mark completes when the work queued before it does; `read()` waits for the last mark."""

    def __init__(self, device: str | torch.device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._marks: list[tuple[str, object]] = []

    def start(self) -> None:
        self._marks = []
        if self.cuda:
            torch.cuda.synchronize()
        self.mark("start")

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append((name, event))
        else:
            self._marks.append((name, time.perf_counter()))

    def read(self) -> dict[str, float]:
        """Seconds from the start to each mark."""
        (_, first), rest = self._marks[0], self._marks[1:]
        if self.cuda:
            rest[-1][1].synchronize()
            return {name: first.elapsed_time(event) / 1e3 for name, event in rest}
        return {name: t - first for name, t in rest}


def time_runs(fn: Callable[[], object], device: str | torch.device, repeats: int = REPEATS, warmup: int = 1,
              inner: int = 1) -> list[float]:
    """Seconds per call of `fn` in each of `repeats` runs of `inner` back-to-back calls, after `warmup`
    untimed calls. Take the median (`median`)."""
    if repeats < 1 or inner < 1:
        raise ValueError("repeats and inner must be >= 1")
    for _ in range(warmup):
        fn()
    watch, runs = Stopwatch(device), []
    for _ in range(repeats):
        watch.start()
        for _ in range(inner):
            fn()
        watch.mark("end")
        runs.append(watch.read()["end"] / inner)
    return runs


def median(runs: list[float]) -> float:
    return statistics.median(runs)


def graphed(fn: Callable[[], None], device: str, use_graph: bool) -> Callable[[], None]:
    """Capture `fn` in a CUDA graph and return its replay (the ops never sync, so they capture); on a CPU
    or with `use_graph` off, return `fn`. Capturing runs `fn` twice first on a side stream (warm-up)."""
    if torch.device(device).type != "cuda" or not use_graph:
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def decode_rate(batch: int, max_tokens: int, runs: list[float], first_runs: list[float]) -> float:
    """Tokens/s after the first token of a batch: the whole call's median less the median of the same call
    with max_tokens=1 (prefill and the first token), for `batch` requests of `max_tokens` each."""
    spent = median(runs) - median(first_runs)
    return batch * (max_tokens - 1) / spent if spent > 0 and max_tokens > 1 else float("nan")


@dataclass
class DecodePhase:
    """One generate-like run of an engine, timed on the host: `call_s` from queueing to the last output,
    `decode_s` from the step that delivered the last request's first token to the last output, and
    `decode_tokens` the tokens delivered in that span (every request is past its prefill there)."""

    call_s: float
    decode_s: float
    decode_tokens: int
    outputs: dict[int, list[int]]

    @property
    def decode_rate(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("nan")


def time_decode_phase(llm, prompts: Sequence[Sequence[int]], params, device: str | torch.device) -> DecodePhase:
    """Run `prompts` through `llm` (hybridcache.LLM) step by step, counting tokens as the steps deliver
    them. The decode span starts at a delivery and counts only later deliveries, so a pipelined step in
    flight then is counted with the time it takes after that point: the steady rate, without prefill."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    streaming, llm.stream_deltas = llm.stream_deltas, True
    try:
        start = time.perf_counter()
        rids = [llm.add_request(list(p), params) for p in prompts]
        waiting, decode_start, tokens, outputs = set(rids), None, 0, {}
        while len(outputs) < len(rids):
            for out in llm.step():
                outputs[out.request_id] = list(out.token_ids)
            for d in llm.take_deltas():
                if decode_start is not None:
                    tokens += len(d.token_ids)
                elif d.token_ids:
                    waiting.discard(d.request_id)
            if decode_start is None and not waiting:
                decode_start = time.perf_counter()
        if cuda:
            torch.cuda.synchronize()
        end = time.perf_counter()
    finally:
        llm.stream_deltas = streaming
    return DecodePhase(end - start, end - (decode_start or end), tokens, outputs)
