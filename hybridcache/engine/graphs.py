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

A verify step can also choose inside its graph (`run_verify_choice`): greedy rows the argmax, the drafts'
check and the counts (`greedy_verify_choice`); rows that sample (any mix with greedy ones) the device
sampler's draft rejection and draws (`device_sampler.sample`, counter-based, so a replay draws what an
eager step would), their parameters static inputs; then the state modules' accept hooks
(`CacheStore.accept_on_device`; a padding row's slot -1 is left alone), all written to static outputs that
the host copies back in one block. Such a step is its own graph (the key says which tail).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..cache import CacheStore
from ..models.batch import ForwardBatch
from ..ops.attention import HostRows
from .device_sampler import RowParams, greedy_verify_choice, packed_choice, sample
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
# a verify graph's choice inputs [bucket] (`run_verify_choice`) and a padding row's values: no drafts, greedy
_CHOICE_PADDING = {"proposed": 0, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "position": 0}
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed", "position")


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor  # [bucket * T]
    batch: ForwardBatch  # its tensors are the graph's static inputs, `bucket` rows
    logits: torch.Tensor  # [bucket * T, V] fp32, the graph's static output
    rows: int  # real rows of the last load: the rest hold padding
    loaded: dict = field(default_factory=dict)  # name -> the repeated input last copied in (kept alive here)
    # a verify graph that chooses: inputs (`_CHOICE_PADDING`'s names) [bucket], outputs choice [bucket, 2 + T]
    # int64 and counts [bucket] int32
    choice_inputs: dict[str, torch.Tensor] | None = None
    choice: torch.Tensor | None = None
    counts: torch.Tensor | None = None

    def load(self, input_ids: torch.Tensor, batch: ForwardBatch, choice_inputs: dict | None = None) -> None:
        """Copies a step of `batch.num_rows` rows (at most the bucket) into the first rows; rows past them
        become padding when the step before had more (their stale choice inputs choose for no row)."""
        rows = batch.num_rows
        self._copy("input_ids", self.input_ids, input_ids)
        self._copy("cached_lens", self.batch.cached_lens, batch.cached_lens)
        repeated = [(name, getattr(self.batch, name), getattr(batch, name)) for name in _REPEATED]
        for name, t in (choice_inputs or {}).items():  # proposed and position change every step, the rest seldom
            repeated.append((name, self.choice_inputs[name], t))
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


def padded_choice_inputs(choice_inputs: dict | None, bucket: int) -> dict[str, torch.Tensor] | None:
    """A choosing verify graph's static inputs [bucket]: the step's [B], then a padding row's values."""
    if choice_inputs is None:
        return None
    return {name: torch.cat([t, torch.full((bucket - len(t),), _CHOICE_PADDING[name], dtype=t.dtype, device=t.device)])
            for name, t in choice_inputs.items()}


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
        self.num_choices = 0  # replays that chose the tokens and accepted inside the graph (`run_verify_choice`)
        self.last: _Graph | None = None  # the graph replayed last (benchmarks time its replay alone)

    def run(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor | None:
        """Logits [N, V] of every fed token, or None when the step is not a graph step (the caller then
        runs it eagerly). input_ids [N] on the device; `batch` the step's eager ForwardBatch."""
        entry = self._replay(input_ids, batch, None)
        return None if entry is None else entry.output(input_ids.shape[0])

    def run_verify_choice(self, input_ids: torch.Tensor, batch: ForwardBatch, proposed: torch.Tensor,
                          sampling: RowParams | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """A step of generation rows, B rows of T tokens (each row's last token, then its drafts), proposed
        [B] int64 the real drafts a row; `sampling` the rows' parameters when any samples (its drafts are
        ignored: the fed ids are the drafts), None when all are greedy. Returns (logits [B * T, V], choice
        [B, 2 + T] int64, counts [B] int32) as `greedy_verify_choice` / `packed_choice(*sample(...))` give
        them, with the state modules' accept applied in the graph; views of its static outputs, which its
        next replay overwrites. None: not a graph step."""
        inputs = {"proposed": proposed}
        if sampling is not None:
            inputs.update((name, getattr(sampling, name)) for name in SAMPLING_FIELDS)
        entry = self._replay(input_ids, batch, inputs)
        if entry is None:
            return None
        self.num_choices += 1
        rows = batch.num_rows
        return entry.output(input_ids.shape[0]), entry.choice[:rows], entry.counts[:rows]

    def _replay(self, input_ids: torch.Tensor, batch: ForwardBatch, choice_inputs: dict | None) -> _Graph | None:
        if batch.num_context_rows:
            return None
        if self.store.device_tier.generation != self._generation:
            self._graphs.clear()
            self._refused.clear()
            self._generation = self.store.device_tier.generation
        bucket = bucket_rows(batch.num_rows)
        tail = None if choice_inputs is None else ("sampled" if "temperature" in choice_inputs else "greedy")
        key = (bucket, batch.generation_tokens, batch.page_table.shape[1], batch.speculative, tail)
        entry = self._graphs.get(key)
        if entry is None:
            if key in self._refused:
                return None
            entry = self._capture(input_ids, batch, bucket, choice_inputs)
            if entry is None:
                self._refused.add(key)
                return None
            self._graphs[key] = entry
            if len(self._graphs) > MAX_GRAPHS:  # each holds its own memory pool: drop the oldest
                del self._graphs[next(iter(self._graphs))]
        entry.load(input_ids, batch, choice_inputs)
        entry.graph.replay()
        self.last = entry
        self.num_replays += 1
        self.num_padding_rows += bucket - batch.num_rows
        return entry

    def _capture(self, input_ids: torch.Tensor, batch: ForwardBatch, bucket: int,
                 choice_inputs: dict | None) -> _Graph | None:
        ids, static = padded_inputs(input_ids, batch, bucket)
        inputs = padded_choice_inputs(choice_inputs, bucket)
        stream = torch.cuda.Stream(ids.device)
        stream.wait_stream(torch.cuda.current_stream(ids.device))
        mode = torch.cuda.get_sync_debug_mode()
        try:
            torch.cuda.set_sync_debug_mode("error")  # a host sync in the warm-up: not capturable, say so now
            try:
                with torch.cuda.stream(stream):
                    self._forward(ids, static, inputs)  # warm-up: compiles, allocates, touches no slot
            finally:
                torch.cuda.set_sync_debug_mode(mode)
            torch.cuda.current_stream(ids.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits, choice, counts = self._forward(ids, static, inputs)
        except RuntimeError:  # a host sync (or another uncapturable op) inside the forward
            torch.cuda.synchronize(ids.device)
            return None
        self.num_captured += 1
        return _Graph(graph, ids, static, logits, rows=bucket, choice_inputs=inputs, choice=choice, counts=counts)

    def _forward(self, ids: torch.Tensor, static: ForwardBatch, choice_inputs: dict | None):
        """(logits, choice, counts): the last two None unless `choice_inputs` ask for a verify tail."""
        T = static.generation_tokens
        positions = generation_positions(static.cached_lens, T)
        logits = self.model.logits(self.model(ids, replace(static, positions=positions)))
        if choice_inputs is None:
            return logits, None, None
        rows_logits, fed, proposed = logits.view(-1, T, logits.shape[-1]), ids.view(-1, T), choice_inputs["proposed"]
        if "temperature" in choice_inputs:
            fields = (choice_inputs[name] for name in SAMPLING_FIELDS)
            choice, counts = packed_choice(*sample(rows_logits, RowParams(*fields, fed[:, 1:], proposed)), proposed)
        else:
            choice, counts = greedy_verify_choice(rows_logits, fed, proposed)
        self.store.accept_on_device(static.slots, T, counts)
        return logits, choice, counts
