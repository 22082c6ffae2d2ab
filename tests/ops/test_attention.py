"""Paged GQA attention: page writes follow the layout, fast == naive, both == dense causal SDPA."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.ops.attention import PageTableError, attend_kv_pages, naive, paged_attention, write_kv

FAST_AND_NAIVE = {"fast": (write_kv, paged_attention), "naive": (naive.write_kv, naive.paged_attention)}
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@dataclass
class Batch:
    """Index tensors of one step. rows: (cached, new) per row, None for a padding row."""

    rows: list[tuple[int, int] | None]
    page_table: torch.Tensor  # [B, W] int32
    cached_lens: torch.Tensor  # [B]
    cu_seqlens: torch.Tensor  # [B + 1]
    num_pages: int
    page_size: int

    @property
    def num_new(self) -> int:
        return int(self.cu_seqlens[-1])

    def token_rows(self) -> list[tuple[int, int, int]]:
        """(row, position, flat index) of every new token."""
        out = []
        for b, spec in enumerate(self.rows):
            if spec is not None:
                cached, new = spec
                start = int(self.cu_seqlens[b])
                out += [(b, cached + i, start + i) for i in range(new)]
        return out

    def slot(self, row: int, pos: int) -> tuple[int, int]:
        """Where the layout says token pos of row lives (computed here, not by the op)."""
        return int(self.page_table[row, pos // self.page_size]), pos % self.page_size


def make_batch(rows: list[tuple[int, int] | None], page_size: int, seed: int = 0, spare_pages: int = 3) -> Batch:
    """Shuffled page ids per row, a trailing -1 column, padding rows all -1."""
    gen = torch.Generator().manual_seed(seed)
    need = [0 if r is None else -(-(r[0] + r[1]) // page_size) for r in rows]
    num_pages = sum(need) + spare_pages
    ids = torch.randperm(num_pages, generator=gen).tolist()
    width = max(need + [0]) + 1
    table = torch.full((len(rows), width), -1, dtype=torch.int32)
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(ids[:n], dtype=torch.int32)
        ids = ids[n:]
    cached = torch.tensor([0 if r is None else r[0] for r in rows], dtype=torch.int32)
    new = torch.tensor([0 if r is None else r[1] for r in rows], dtype=torch.int32)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), new.cumsum(0).to(torch.int32)])
    return Batch(rows, table, cached, cu, num_pages, page_size)


@dataclass
class Sequences:
    """Full sequences (prefix + new) per row, and the new tokens flat."""

    q: list[torch.Tensor]  # per row [cached + new, Hq, D]
    k: list[torch.Tensor]  # per row [cached + new, Hkv, D]
    v: list[torch.Tensor]

    def flat_new(self, batch: Batch, which: str) -> torch.Tensor:
        parts = [getattr(self, which)[b][spec[0] :] for b, spec in enumerate(batch.rows) if spec is not None]
        return torch.cat(parts)


def make_sequences(batch: Batch, hq: int, hkv: int, d: int, dtype: torch.dtype, seed: int = 1) -> Sequences:
    gen = torch.Generator().manual_seed(seed)
    lengths = [0 if r is None else r[0] + r[1] for r in batch.rows]
    return Sequences(
        *([torch.randn(n, h, d, generator=gen).to(dtype) for n in lengths] for h in (hq, hkv, hkv))
    )


def make_pool(batch: Batch, seqs: Sequences, hkv: int, d: int, dtype: torch.dtype, fill: float | None = None) -> torch.Tensor:
    """Pool with stale contents (random, or `fill`), the cached prefixes placed by the layout formula."""
    shape = (batch.num_pages, 2, batch.page_size, hkv, d)
    kv = torch.randn(shape, generator=torch.Generator().manual_seed(7)) if fill is None else torch.full(shape, fill)
    kv = kv.to(dtype)
    for b, spec in enumerate(batch.rows):
        for pos in range(0 if spec is None else spec[0]):
            page, off = batch.slot(b, pos)
            kv[page, 0, off], kv[page, 1, off] = seqs.k[b][pos], seqs.v[b][pos]
    return kv


def dense_reference(batch: Batch, seqs: Sequences, scale: float | None = None) -> torch.Tensor:
    """Outside oracle: dense causal SDPA over each full sequence in fp32, the new tokens' rows kept."""
    outs = []
    for b, spec in enumerate(batch.rows):
        if spec is None or spec[1] == 0:
            continue
        q, k, v = (x[b].float().transpose(0, 1)[None] for x in (seqs.q, seqs.k, seqs.v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        outs.append(o[0].transpose(0, 1)[spec[0] :])
    return torch.cat(outs) if outs else torch.zeros(0)


MIXED = [(0, 5), (13, 1), None, (7, 0), (21, 4), (0, 1), (3, 8), (40, 2)]  # prefill, decode, pad, idle, verify
WITH_LONG = MIXED + [(6, 23)]  # a prefill row long enough to run in its own group


@pytest.mark.parametrize("impl", FAST_AND_NAIVE)
@pytest.mark.parametrize("page_size", [4, 16])
def test_write_lands_where_layout_says_and_nowhere_else(impl: str, page_size: int) -> None:
    batch = make_batch(WITH_LONG, page_size)
    seqs = make_sequences(batch, 4, 2, 8, torch.float32)
    kv = make_pool(batch, seqs, 2, 8, torch.float32)
    expected = kv.clone()
    k, v = seqs.flat_new(batch, "k"), seqs.flat_new(batch, "v")
    for row, pos, n in batch.token_rows():
        page, off = batch.slot(row, pos)
        expected[page, 0, off], expected[page, 1, off] = k[n], v[n]
    FAST_AND_NAIVE[impl][0](kv, k, v, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    assert torch.equal(kv, expected)


@pytest.mark.parametrize("impl", FAST_AND_NAIVE)
def test_padding_rows_write_nothing(impl: str) -> None:
    batch = make_batch([None, None, (0, 0)], 4)
    kv = torch.randn(batch.num_pages, 2, 4, 2, 8)
    before = kv.clone()
    empty = torch.zeros(0, 2, 8)
    out = FAST_AND_NAIVE[impl][1](torch.zeros(0, 4, 8), empty, empty, kv, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    assert out.shape == (0, 4, 8)
    assert torch.equal(kv, before)


@pytest.mark.parametrize("impl", FAST_AND_NAIVE)
@pytest.mark.parametrize("bad", ["minus_one", "past_table"])
def test_token_without_page_raises_and_writes_nothing(impl: str, bad: str) -> None:
    batch = make_batch([(2, 3), (4, 2)], 4)
    if bad == "minus_one":
        batch.page_table[1, 1] = -1
    else:
        batch.page_table = batch.page_table[:, :1].contiguous()
    kv = torch.randn(batch.num_pages, 2, 4, 2, 8)
    before = kv.clone()
    k = torch.randn(5, 2, 8)
    fast = impl == "fast"
    with pytest.raises(PageTableError):
        FAST_AND_NAIVE[impl][0](kv, k, k, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    if fast:  # the fast path checks every token before writing any
        assert torch.equal(kv, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_fast_matches_naive(group: int, page_size: int, dtype: torch.dtype, device: str) -> None:
    hkv, d = 2, 16
    batch = make_batch(WITH_LONG, page_size, seed=group)
    seqs = make_sequences(batch, hkv * group, hkv, d, dtype, seed=page_size)
    q, k, v = (seqs.flat_new(batch, x).to(device) for x in "qkv")
    idx = tuple(t.to(device) for t in (batch.page_table, batch.cached_lens, batch.cu_seqlens))
    kv_fast, kv_naive = (make_pool(batch, seqs, hkv, d, dtype).to(device) for _ in range(2))
    out_fast = paged_attention(q, k, v, kv_fast, *idx)
    out_naive = naive.paged_attention(q, k, v, kv_naive, *idx)
    assert out_fast.dtype == dtype and out_fast.shape == (batch.num_new, hkv * group, d)
    torch.testing.assert_close(out_fast, out_naive, **TOL[dtype])
    assert torch.equal(kv_fast, kv_naive)


@pytest.mark.parametrize("impl", FAST_AND_NAIVE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4])
def test_matches_dense_causal_sdpa(impl: str, dtype: torch.dtype, group: int, device: str) -> None:
    batch = make_batch(WITH_LONG, 4, seed=3)
    seqs = make_sequences(batch, 2 * group, 2, 8, dtype, seed=4)
    kv = make_pool(batch, seqs, 2, 8, dtype).to(device)
    q, k, v = (seqs.flat_new(batch, x).to(device) for x in "qkv")
    idx = tuple(t.to(device) for t in (batch.page_table, batch.cached_lens, batch.cu_seqlens))
    out = FAST_AND_NAIVE[impl][1](q, k, v, kv, *idx)
    torch.testing.assert_close(out.float().cpu(), dense_reference(batch, seqs), **TOL[dtype])


def test_write_into_non_contiguous_pool() -> None:
    """A pool slice that is not contiguous takes the index_put_ path; same placement."""
    batch = make_batch(MIXED, 4)
    seqs = make_sequences(batch, 4, 2, 8, torch.float32)
    k, v = seqs.flat_new(batch, "k"), seqs.flat_new(batch, "v")
    contiguous = make_pool(batch, seqs, 2, 8, torch.float32)
    strided = torch.zeros(2 * batch.num_pages, *contiguous.shape[1:])[::2]
    strided.copy_(contiguous)
    assert not strided.is_contiguous()
    for pool in (contiguous, strided):
        write_kv(pool, k, v, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    assert torch.equal(strided, contiguous)
    naive_pool = make_pool(batch, seqs, 2, 8, torch.float32)
    naive.write_kv(naive_pool, k, v, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    assert torch.equal(contiguous, naive_pool)


@pytest.mark.parametrize("impl", FAST_AND_NAIVE)
def test_scale_argument(impl: str) -> None:
    batch = make_batch(MIXED, 16)
    seqs = make_sequences(batch, 4, 2, 8, torch.float32)
    kv = make_pool(batch, seqs, 2, 8, torch.float32)
    q, k, v = (seqs.flat_new(batch, x) for x in "qkv")
    out = FAST_AND_NAIVE[impl][1](q, k, v, kv, batch.page_table, batch.cached_lens, batch.cu_seqlens, scale=0.77)
    torch.testing.assert_close(out, dense_reference(batch, seqs, scale=0.77), **TOL[torch.float32])


def test_stale_nan_in_pool_does_not_leak() -> None:
    """Slots past a row's length (page tails, page 0 behind -1 entries) may hold NaN from earlier owners."""
    batch = make_batch(WITH_LONG, 16, seed=5)
    seqs = make_sequences(batch, 4, 2, 8, torch.float32)
    kv = make_pool(batch, seqs, 2, 8, torch.float32, fill=float("nan"))
    q, k, v = (seqs.flat_new(batch, x) for x in "qkv")
    out = paged_attention(q, k, v, kv, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    torch.testing.assert_close(out, dense_reference(batch, seqs), **TOL[torch.float32])


def test_attend_reads_only() -> None:
    batch = make_batch(MIXED, 4)
    seqs = make_sequences(batch, 4, 2, 8, torch.float32)
    kv = make_pool(batch, seqs, 2, 8, torch.float32)
    q, k, v = (seqs.flat_new(batch, x) for x in "qkv")
    write_kv(kv, k, v, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    written = kv.clone()
    out = attend_kv_pages(q, kv, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    assert torch.equal(kv, written)
    torch.testing.assert_close(out, dense_reference(batch, seqs), **TOL[torch.float32])


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(st.lists(st.integers(1, 20), min_size=1, max_size=6), min_size=1, max_size=3),
    page_size=st.sampled_from([4, 16]),
    group=st.sampled_from([1, 2, 4]),
)
def test_incremental_steps_equal_one_dense_pass(steps: list[list[int]], page_size: int, group: int) -> None:
    """Each row is fed in chunks (prefill chunks, decode, verify sizes), all rows stepping together;
    every token's output equals dense causal SDPA over the whole sequence."""
    hkv, d = 2, 8
    totals = [sum(s) for s in steps]
    batch = make_batch([(0, n) for n in totals], page_size, seed=len(totals))
    seqs = make_sequences(batch, hkv * group, hkv, d, torch.float32)
    kv = torch.full((batch.num_pages, 2, page_size, hkv, d), float("nan"))
    got = [[] for _ in steps]
    done = [0] * len(steps)
    for step in range(max(len(s) for s in steps)):
        counts = [s[step] if step < len(s) else 0 for s in steps]
        cu = torch.tensor([0] + counts).cumsum(0).to(torch.int32)
        cached = torch.tensor(done, dtype=torch.int32)
        pick = lambda x: torch.cat([x[b][done[b] : done[b] + counts[b]] for b in range(len(steps))])  # noqa: E731
        out = paged_attention(pick(seqs.q), pick(seqs.k), pick(seqs.v), kv, batch.page_table, cached, cu)
        for b in range(len(steps)):
            got[b].append(out[int(cu[b]) : int(cu[b + 1])])
            done[b] += counts[b]
    torch.testing.assert_close(torch.cat([torch.cat(g) for g in got]), dense_reference(batch, seqs), **TOL[torch.float32])


def test_scratch_made_in_inference_mode_serves_later_calls_outside_it():
    from hybridcache.ops.attention._scratch import release_scratch, scratch

    release_scratch()
    with torch.inference_mode():
        first = scratch((4, 8), torch.float32, torch.device("cpu"), slot=0)
        first.fill_(1.0)
    with torch.no_grad():
        again = scratch((4, 8), torch.float32, torch.device("cpu"), slot=0)
        again.fill_(2.0)  # raised "Inplace update to inference tensor" when the buffer was an inference tensor
    assert torch.equal(again, torch.full((4, 8), 2.0))
    release_scratch()
