"""CUDA graphs of decode and verify steps: one graph per (row bucket, tokens per row, page-table width, carving).

A step of generation rows only replays a captured graph of the model forward and its LM head: the step's
inputs are copied into the graph's static tensors, the graph replays, and the logits of every fed token
are read from its static output. A graph serves a bucket of batch sizes (`bucket_rows`): a step of fewer
rows fills the first ones, and the rest are padding rows, slot -1 (no recurrent state read or written)
and no pages (-1: attention writes nothing and reads nothing), whose logits are not returned. A steady
batch keeps its bucket for many steps; a batch that shrinks as requests finish mostly stays in one.

Capture runs once eagerly first (kernels compile and allocate outside the graph) with every row's slot
set to -1, so no recurrent state is read or written; attention writes the real rows' keys and values at
positions past their committed tokens, which the real step overwrites. The graph's attention knows no row
lengths on the host (`HostRows.uniform_new`: its work is sized from the page table's width). A forward
that cannot be captured (a host sync inside, e.g. fp32 MoE on CUDA past `experts.DENSE_LIMIT` rows x
experts) is remembered and runs eagerly.
A rebalance re-carves the arena: graphs of an older carving are dropped.

A verify step whose rows are all greedy can also choose inside its graph (`run_greedy_verify`): the argmax,
the drafts' check and the counts (`greedy_verify_choice`), and the state modules' accept hooks
(`CacheStore.accept_on_device`; a padding row's slot -1 is left alone), written to static outputs that the
host copies back in one block. Such a step is its own graph (the key says so).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..cache import CacheStore
from ..models.batch import ForwardBatch
from ..ops.attention import HostRows
from .device_sampler import greedy_verify_choice
from .forward_batch import generation_positions

MAX_GRAPHS = 64  # captured shapes kept at once (a steady batch uses one; widths and sizes change slowly)


def bucket_rows(rows: int) -> int:
    """The batch size a graph of `rows` rows is captured at: 1, 2, 4, 8, then multiples of 8 up to 256, then
    of 32 (padding costs little in a step that reads every weight once, and each graph holds memory)."""
    if rows <= 8:
        return 1 << (rows - 1).bit_length()
    step = 8 if rows <= 256 else 32
    return -(-rows // step) * step


# inputs a steady batch passes as the same objects while their content holds (`cache.step.StepTensors`, which
# never writes them in place): copied into the graph only when another object comes. Per step only the token
# ids and committed lengths are copied: positions are computed inside the graph from the lengths, and the
# offsets (cu_seqlens) not at all, since generation rows feed the same number of tokens each.
_REPEATED = ("slots", "has_initial", "page_table")
# what a padding row holds: no recurrent slot, no pages, an empty prefix
_PADDING = {"slots": -1, "page_table": -1, "cached_lens": 0, "has_initial": False}


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor  # [bucket * T]
    batch: ForwardBatch  # its tensors are the graph's static inputs, `bucket` rows
    logits: torch.Tensor  # [bucket * T, V] fp32, the graph's static output
    rows: int  # real rows of the last load: the rest hold padding
    loaded: dict = field(default_factory=dict)  # name -> the repeated input last copied in (kept alive here)
    # a greedy verify graph's: input proposed [bucket] int64, outputs choice [bucket, 2 + T] int64, counts [bucket]
    proposed: torch.Tensor | None = None
    choice: torch.Tensor | None = None
    counts: torch.Tensor | None = None

    def load(self, input_ids: torch.Tensor, batch: ForwardBatch, proposed: torch.Tensor | None = None) -> None:
        """Copies a step of `batch.num_rows` rows (at most the bucket) into the first rows; rows past them
        become padding when the step before had more."""
        rows = batch.num_rows
        self._copy("input_ids", self.input_ids, input_ids)
        self._copy("cached_lens", self.batch.cached_lens, batch.cached_lens)
        repeated = [(name, getattr(self.batch, name), getattr(batch, name)) for name in _REPEATED]
        if proposed is not None:
            repeated.append(("proposed", self.proposed, proposed))
        for name, static, t in repeated:
            if self.loaded.get(name) is not t or rows > self.rows:
                self._copy(name, static, t)
                self.loaded[name] = t
        if rows < self.rows:
            for name, value in _PADDING.items():
                getattr(self.batch, name)[rows:self.rows].fill_(value)
        self.rows = rows

    def _copy(self, name: str, static: torch.Tensor, src: torch.Tensor) -> None:
        """static[:len(src)] = src."""
        dst = static if static.shape == src.shape else static[: src.shape[0]]
        dst.copy_(src, non_blocking=True)

    def output(self, num_tokens: int) -> torch.Tensor:
        """Logits [num_tokens, V] of the real rows' tokens (a view of the static output)."""
        return self.logits if num_tokens == self.logits.shape[0] else self.logits[:num_tokens]


def padded_inputs(input_ids: torch.Tensor, batch: ForwardBatch, bucket: int) -> tuple[torch.Tensor, ForwardBatch]:
    """Fresh static inputs of `bucket` rows for a generation-only `batch`: its rows first, then padding rows
    (`_PADDING`). Every slot is -1 here, the real rows' too (capture touches no state); `_Graph.load` puts
    the step's own in before each replay. Positions are None: the graph computes them from cached_lens.

    input_ids [N = B * T] -> [bucket * T]; the batch's [B] and [B, W] tensors -> [bucket] and [bucket, W]."""
    t, pad = batch.generation_tokens, bucket - batch.num_rows

    def grow(x: torch.Tensor, value, per_row: int = 1) -> torch.Tensor:
        tail = torch.full((pad * per_row, *x.shape[1:]), value, dtype=x.dtype, device=x.device)
        return torch.cat([x, tail])

    cu = torch.arange(bucket + 1, dtype=batch.cu_seqlens.dtype, device=batch.cu_seqlens.device) * t
    static = replace(
        batch,
        positions=None, cu_seqlens=cu, cached_lens=grow(batch.cached_lens, 0),
        slots=torch.full((bucket,), -1, dtype=batch.slots.dtype, device=batch.slots.device),
        has_initial=grow(batch.has_initial, False), page_table=grow(batch.page_table, -1),
        host_rows=HostRows(None, None, pages_checked=batch.host_rows is not None and batch.host_rows.pages_checked,
                           uniform_new=t),  # lengths vary by replay: none baked in
    )
    return grow(input_ids, 0, t), static


def padded_proposed(proposed: torch.Tensor, bucket: int) -> torch.Tensor:
    """A greedy verify graph's static proposed drafts [bucket]: the step's [B], then 0 for padding rows."""
    return torch.cat([proposed, proposed.new_zeros(bucket - len(proposed))])


class DecodeGraphs:
    """The captured graphs of one model and store (CUDA only: the runner makes none elsewhere)."""

    def __init__(self, model: torch.nn.Module, store: CacheStore) -> None:
        self.model, self.store = model, store
        self._graphs: dict[tuple, _Graph] = {}
        self._refused: set[tuple] = set()
        self._generation = store.device_tier.generation
        self.num_captured = 0
        self.num_replays = 0
        self.num_padding_rows = 0  # padding rows replayed, summed over replays
        self.num_choices = 0  # replays that chose the tokens and accepted inside the graph (`run_greedy_verify`)
        self.last: _Graph | None = None  # the graph replayed last (benchmarks time its replay alone)

    def run(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor | None:
        """Logits [N, V] of every fed token, or None when the step is not a graph step (the caller then
        runs it eagerly). input_ids [N] on the device; `batch` the step's eager ForwardBatch."""
        entry = self._replay(input_ids, batch, None)
        return None if entry is None else entry.output(input_ids.shape[0])

    def run_greedy_verify(self, input_ids: torch.Tensor, batch: ForwardBatch,
                          proposed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """A step of generation rows that are all greedy, B rows of T tokens (each row's last token, then
        its drafts), proposed [B] int64 the real drafts a row: (logits [B * T, V], choice [B, 2 + T] int64,
        counts [B] int32) as `greedy_verify_choice` gives them, with the state modules' accept applied in
        the graph; views of its static outputs, which its next replay overwrites. None: not a graph step."""
        entry = self._replay(input_ids, batch, proposed)
        if entry is None:
            return None
        self.num_choices += 1
        rows = batch.num_rows
        return entry.output(input_ids.shape[0]), entry.choice[:rows], entry.counts[:rows]

    def _replay(self, input_ids: torch.Tensor, batch: ForwardBatch, proposed: torch.Tensor | None) -> _Graph | None:
        if batch.num_context_rows:
            return None
        if self.store.device_tier.generation != self._generation:
            self._graphs.clear()
            self._refused.clear()
            self._generation = self.store.device_tier.generation
        bucket = bucket_rows(batch.num_rows)
        key = (bucket, batch.generation_tokens, batch.page_table.shape[1], batch.speculative, proposed is not None)
        entry = self._graphs.get(key)
        if entry is None:
            if key in self._refused:
                return None
            entry = self._capture(input_ids, batch, bucket, proposed)
            if entry is None:
                self._refused.add(key)
                return None
            self._graphs[key] = entry
            if len(self._graphs) > MAX_GRAPHS:  # each holds its own memory pool: drop the oldest
                del self._graphs[next(iter(self._graphs))]
        entry.load(input_ids, batch, proposed)
        entry.graph.replay()
        self.last = entry
        self.num_replays += 1
        self.num_padding_rows += bucket - batch.num_rows
        return entry

    def _capture(self, input_ids: torch.Tensor, batch: ForwardBatch, bucket: int,
                 proposed: torch.Tensor | None) -> _Graph | None:
        ids, static = padded_inputs(input_ids, batch, bucket)
        if proposed is not None:
            proposed = padded_proposed(proposed, bucket)
        stream = torch.cuda.Stream(ids.device)
        stream.wait_stream(torch.cuda.current_stream(ids.device))
        mode = torch.cuda.get_sync_debug_mode()
        try:
            torch.cuda.set_sync_debug_mode("error")  # a host sync in the warm-up: not capturable, say so now
            try:
                with torch.cuda.stream(stream):
                    self._forward(ids, static, proposed)  # warm-up: compiles, allocates, touches no slot
            finally:
                torch.cuda.set_sync_debug_mode(mode)
            torch.cuda.current_stream(ids.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits, choice, counts = self._forward(ids, static, proposed)
        except RuntimeError:  # a host sync (or another uncapturable op) inside the forward
            torch.cuda.synchronize(ids.device)
            return None
        self.num_captured += 1
        return _Graph(graph, ids, static, logits, rows=bucket, proposed=proposed, choice=choice, counts=counts)

    def _forward(self, ids: torch.Tensor, static: ForwardBatch, proposed: torch.Tensor | None):
        """(logits, choice, counts): the last two None unless `proposed` asks for the greedy verify tail."""
        T = static.generation_tokens
        positions = generation_positions(static.cached_lens, T)
        logits = self.model.logits(self.model(ids, replace(static, positions=positions)))
        if proposed is None:
            return logits, None, None
        choice, counts = greedy_verify_choice(logits.view(-1, T, logits.shape[-1]), ids.view(-1, T), proposed)
        self.store.accept_on_device(static.slots, T, counts)
        return logits, choice, counts
