"""CUDA graphs of decode and verify steps: one graph per (rows, tokens per row, page-table width, carving).

A step of generation rows only replays a captured graph of the model forward and its LM head: the step's
inputs are copied into the graph's static tensors, the graph replays, and the logits of every fed token
are read from its static output. Nothing is padded: a graph serves exactly its batch size, and is
captured the first time that shape comes (a steady decode batch keeps its shape for many steps).

Capture runs once eagerly first (kernels compile and allocate outside the graph) with every row's slot
set to -1, so no recurrent state is read or written; attention writes the rows' keys and values at
positions past their committed tokens, which the real step overwrites. The graph's attention knows no row
lengths on the host (`HostRows.uniform_new`: its work is sized from the page table's width). A forward
that cannot be captured (a host sync inside, e.g. fp32 MoE on CUDA past `experts.DENSE_LIMIT` rows x
experts) is remembered and runs eagerly.
A rebalance re-carves the arena: graphs of an older carving are dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..cache import CacheStore
from ..models.batch import ForwardBatch
from ..ops.attention import HostRows

MAX_GRAPHS = 64  # captured shapes kept at once (a steady batch uses one; widths and sizes change slowly)


# inputs a steady batch passes as the same objects while their content holds (`cache.step.StepTensors`, which
# never writes them in place): copied into the graph only when another object comes
_REPEATED = ("cu_seqlens", "slots", "has_initial")


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    batch: ForwardBatch  # its tensors are the graph's static inputs
    logits: torch.Tensor  # [N, V] fp32, the graph's static output
    loaded: dict = field(default_factory=dict)  # name -> the repeated input last copied in (kept alive here)

    def load(self, input_ids: torch.Tensor, batch: ForwardBatch) -> None:
        self.input_ids.copy_(input_ids, non_blocking=True)
        for name in ("positions", "cached_lens", "page_table"):
            getattr(self.batch, name).copy_(getattr(batch, name), non_blocking=True)
        for name in _REPEATED:
            t = getattr(batch, name)
            if self.loaded.get(name) is not t:
                getattr(self.batch, name).copy_(t, non_blocking=True)
                self.loaded[name] = t


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, store: CacheStore) -> None:
        self.model, self.store = model, store
        self._graphs: dict[tuple, _Graph] = {}
        self._refused: set[tuple] = set()
        self._generation = store.device_tier.generation
        self.num_captured = 0
        self.num_replays = 0

    def run(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor | None:
        """Logits [N, V] of every fed token, or None when the step is not a graph step (the caller then
        runs it eagerly). input_ids [N] on the device; `batch` the step's eager ForwardBatch."""
        if batch.num_context_rows or not input_ids.is_cuda:
            return None
        if self.store.device_tier.generation != self._generation:
            self._graphs.clear()
            self._refused.clear()
            self._generation = self.store.device_tier.generation
        key = (batch.num_rows, batch.generation_tokens, batch.page_table.shape[1], batch.speculative)
        entry = self._graphs.get(key)
        if entry is None:
            if key in self._refused:
                return None
            entry = self._capture(input_ids, batch)
            if entry is None:
                self._refused.add(key)
                return None
            self._graphs[key] = entry
            if len(self._graphs) > MAX_GRAPHS:  # each holds its own memory pool: drop the oldest
                del self._graphs[next(iter(self._graphs))]
        entry.load(input_ids, batch)
        entry.graph.replay()
        self.num_replays += 1
        return entry.logits

    def _capture(self, input_ids: torch.Tensor, batch: ForwardBatch) -> _Graph | None:
        static = replace(
            batch,
            positions=batch.positions.clone(), cu_seqlens=batch.cu_seqlens.clone(),
            cached_lens=batch.cached_lens.clone(), slots=torch.full_like(batch.slots, -1),
            has_initial=batch.has_initial.clone(), page_table=batch.page_table.clone(),
            host_rows=HostRows(None, None, pages_checked=batch.host_rows is not None and batch.host_rows.pages_checked,
                               uniform_new=batch.generation_tokens),  # lengths vary by replay: none baked in
        )
        ids = input_ids.clone()
        stream = torch.cuda.Stream(ids.device)
        stream.wait_stream(torch.cuda.current_stream(ids.device))
        mode = torch.cuda.get_sync_debug_mode()
        try:
            torch.cuda.set_sync_debug_mode("error")  # a host sync in the warm-up: not capturable, say so now
            try:
                with torch.cuda.stream(stream):
                    self.model.logits(self.model(ids, static))  # warm-up: compiles, allocates, touches no slot
            finally:
                torch.cuda.set_sync_debug_mode(mode)
            torch.cuda.current_stream(ids.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits = self.model.logits(self.model(ids, static))
        except RuntimeError:  # a host sync (or another uncapturable op) inside the forward
            torch.cuda.synchronize(ids.device)
            return None
        self.num_captured += 1
        return _Graph(graph, ids, static, logits)
