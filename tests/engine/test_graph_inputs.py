"""`graphs._Graph.load` and `graphs.padded_inputs` on the CPU: what a replay reads is always the step's
inputs in the first rows and padding in the rest (slot -1, no pages), whether the repeated inputs (the same
objects again) are copied or skipped and whichever row count came before. The graph itself needs CUDA;
loading is plain copies."""
from __future__ import annotations

import pytest
import torch

from hybridcache.engine.forward_batch import generation_positions
from hybridcache.engine.graphs import _PADDING, _REPEATED, _Graph, bucket_rows, padded_inputs
from hybridcache.models.batch import ForwardBatch
from hybridcache.ops.attention import HostRows

T, WIDTH = 2, 3
PER_STEP = ("input_ids", "cached_lens")


class Logging(_Graph):
    """A graph whose loads record what they copy."""

    copies: list[str]

    def _copy(self, name, static, src):
        self.copies.append(name)
        super()._copy(name, static, src)


def step(rows: int, seed: int) -> tuple[torch.Tensor, ForwardBatch]:
    g = torch.Generator().manual_seed(seed)
    cached = torch.randint(0, 40, (rows,), generator=g, dtype=torch.int32)
    batch = ForwardBatch(
        positions=(cached.long()[:, None] + torch.arange(T)).flatten(),
        cu_seqlens=torch.arange(rows + 1, dtype=torch.int32) * T, cached_lens=cached,
        slots=torch.randperm(50, generator=g)[:rows], has_initial=torch.ones(rows, dtype=torch.bool),
        page_table=torch.randint(0, 90, (rows, WIDTH), generator=g, dtype=torch.int32),
        num_context_rows=0, num_context_tokens=0, generation_tokens=T, states={}, pages={}, speculative=True,
        host_rows=HostRows(cached.numpy(), torch.full((rows,), T).numpy(), pages_checked=True),
    )
    return torch.randint(0, 1000, (rows * T,), generator=g), batch


def assert_reads(graph: _Graph, ids: torch.Tensor, batch: ForwardBatch, bucket: int) -> None:
    rows, s = batch.num_rows, graph.batch
    assert torch.equal(graph.input_ids[: rows * T], ids)
    assert s.positions is None  # computed inside the graph from cached_lens
    for name in ("cached_lens", *_REPEATED):
        assert torch.equal(getattr(s, name)[:rows], getattr(batch, name)), name
    for name, value in _PADDING.items():
        assert (getattr(s, name)[rows:] == value).all(), name
    assert torch.equal(s.cu_seqlens, torch.arange(bucket + 1, dtype=torch.int32) * T)  # the step's offsets come first
    assert s.host_rows.cached_lens is None and s.host_rows.uniform_new == T and s.host_rows.pages_checked


@pytest.mark.parametrize("rows, bucket", [(1, 1), (3, 4), (5, 8), (8, 8), (9, 16), (17, 24), (250, 256), (257, 288)])
def test_buckets(rows, bucket):
    assert bucket_rows(rows) == bucket


def test_a_replay_reads_the_steps_rows_then_padding():
    bucket = 8
    ids, first = step(5, 0)
    static_ids, static = padded_inputs(ids, first, bucket)
    assert static.num_rows == bucket and static_ids.shape == (bucket * T,)
    assert (static.slots == -1).all()  # capture touches no recurrent state, the real rows' neither
    graph = Logging(None, static_ids, static, None, rows=bucket)
    graph.copies = []
    graph.load(ids, first)
    assert sorted(graph.copies) == sorted([*PER_STEP, *_REPEATED])
    assert_reads(graph, ids, first, bucket)

    steady = ForwardBatch(**{**vars(first), "positions": first.positions + 1, "cached_lens": first.cached_lens + 1})
    graph.copies = []
    graph.load(ids + 1, steady)
    assert sorted(graph.copies) == sorted(PER_STEP)  # slots, has_initial, page table: the same objects, skipped
    assert_reads(graph, ids + 1, steady, bucket)

    written = ForwardBatch(**{**vars(steady), "page_table": steady.page_table.clone()})  # a page-table write
    written.page_table[0, 0] += 1
    graph.copies = []
    graph.load(ids + 2, written)
    assert sorted(graph.copies) == sorted([*PER_STEP, "page_table"])
    assert_reads(graph, ids + 2, written, bucket)

    for rows, seed in ((3, 1), (7, 2), (2, 3), (8, 4)):  # fewer rows leave padding behind them, more overwrite it
        ids, batch = step(rows, seed)
        graph.load(ids, batch)
        assert_reads(graph, ids, batch, bucket)


@pytest.mark.parametrize("tokens", [1, 4])
def test_generation_positions_follow_the_lengths(tokens: int) -> None:
    """A graph's positions from its cached_lens (int32): row b's are cached_lens[b] + 0 .. T - 1, int64, a fresh
    tensor (a decode step's, T = 1, only the cast)."""
    lens = torch.tensor([5, 0, 17], dtype=torch.int32)
    got = generation_positions(lens, tokens)
    want = torch.tensor([[n + t for t in range(tokens)] for n in (5, 0, 17)]).flatten()
    assert got.dtype == torch.int64 and torch.equal(got, want)
    got[0] += 1
    assert lens[0] == 5
    assert generation_positions(want, 1) is not want  # int64 lengths: still a fresh tensor
