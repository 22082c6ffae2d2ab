"""The attention ops told what the host knows (`HostRows`: the row lengths, a page table checked there) give
the same outputs and pools, bit for bit, as the ops that read it back, and make no host sync; a table that
was not checked still raises PageTableError, and one wrongly claimed checked fails loudly, writing no page
that is not the row's own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridcache.ops.attention import HostRows, PageTableError, mla_paged_attention, paged_attention, write_kv
from hybridcache.ops.attention._batched import group_rows
from tests.ops import test_attention_mla as mla_t
from tests.ops.test_attention import MIXED, WITH_LONG, Batch, make_batch, make_pool, make_sequences
from tests.ops.tripwire import no_host_sync


def host_rows(batch: Batch, pages_checked: bool) -> HostRows:
    return HostRows(batch.cached_lens.numpy().astype(np.int64), np.diff(batch.cu_seqlens.numpy()).astype(np.int64),
                    pages_checked)


def indices(batch: Batch, device: str) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(device) for t in (batch.page_table, batch.cached_lens, batch.cu_seqlens))


def gqa_case(batch: Batch, device: str, seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(q, k, v) of the new tokens and a pool holding the cached prefixes, on `device`."""
    seqs = make_sequences(batch, 4, 2, 8, torch.float32, seed=seed)
    return [seqs.flat_new(batch, x).to(device) for x in "qkv"], make_pool(batch, seqs, 2, 8, torch.float32).to(device)


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize("page_size", [4, 16])
def test_group_rows_equal_with_host_rows(page_size: int, checked: bool) -> None:
    batch = make_batch(WITH_LONG + [(5, 17), (0, 16)], page_size)
    read_back = group_rows(batch.cached_lens, batch.cu_seqlens)
    given = group_rows(batch.cached_lens, batch.cu_seqlens, host=host_rows(batch, checked))
    assert len(read_back) == len(given) == 3  # the short rows, then each long one alone
    for a, b in zip(read_back, given):
        assert (a.max_new, a.max_len, a.min_len) == (b.max_new, b.max_len, b.min_len)
        for name in ("rows", "starts", "counts", "cached"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize("rows", [WITH_LONG, [(13, 1), (40, 1), (2, 1)], [(21, 4), (3, 4), None]],
                         ids=["mixed", "decode", "verify"])
def test_paged_attention_equal_with_host_rows(rows, checked: bool, device: str) -> None:
    batch = make_batch(rows, 4, seed=len(rows))
    (q, k, v), kv = gqa_case(batch, device)
    kv_given = kv.clone()
    want = paged_attention(q, k, v, kv, *indices(batch, device))
    got = paged_attention(q, k, v, kv_given, *indices(batch, device), host=host_rows(batch, checked))
    assert torch.equal(got, want)
    assert torch.equal(kv_given, kv)


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize("absorb", [None, True, False])
def test_mla_equal_with_host_rows(absorb: bool | None, checked: bool, device: str) -> None:
    batch = make_batch(WITH_LONG, 4, seed=2)
    inputs = mla_t.make_inputs(batch, torch.float32)
    w_k, w_v = (w.to(device) for w in mla_t.make_weights())
    args = [mla_t.flat_new(batch, inputs[x]).to(device) for x in ("q_nope", "q_rope", "latent", "k_rope")]
    pages = mla_t.make_pages(batch, inputs, torch.float32).to(device)
    pages_given = pages.clone()
    want = mla_paged_attention(*args, pages, *indices(batch, device), w_k, w_v, absorb=absorb)
    got = mla_paged_attention(*args, pages_given, *indices(batch, device), w_k, w_v, absorb=absorb,
                              host=host_rows(batch, checked))
    assert torch.equal(got, want)
    assert torch.equal(pages_given, pages)


def test_no_host_sync_with_checked_host_rows() -> None:
    """The CPU tripwire (tests/ops/tripwire.py): what would synchronise on a GPU raises here."""
    batch = make_batch(MIXED, 4)
    (q, k, v), kv = gqa_case(batch, "cpu")
    inputs = mla_t.make_inputs(batch, torch.float32)
    mla_args = [mla_t.flat_new(batch, inputs[x]) for x in ("q_nope", "q_rope", "latent", "k_rope")]
    pages = mla_t.make_pages(batch, inputs, torch.float32)
    w_k, w_v = mla_t.make_weights()
    host = host_rows(batch, pages_checked=True)
    with no_host_sync():
        paged_attention(q, k, v, kv, *indices(batch, "cpu"), host=host)
        mla_paged_attention(*mla_args, pages, *indices(batch, "cpu"), w_k, w_v, host=host)
    for partial in (None, host_rows(batch, pages_checked=False)):  # the tripwire does see the read-backs
        with pytest.raises(AssertionError, match="host sync"), no_host_sync():
            paged_attention(q, k, v, kv, *indices(batch, "cpu"), host=partial)


def bad_table(batch: Batch, how: str) -> None:
    """Row 1's second page gone (-1), or the table cut to one column, in place."""
    if how == "minus_one":
        batch.page_table[1, 1] = -1
    else:
        batch.page_table = batch.page_table[:, :1].contiguous()


@pytest.mark.parametrize("how", ["minus_one", "past_table"])
def test_unchecked_host_rows_still_raise_page_table_error(how: str) -> None:
    batch = make_batch([(2, 3), (4, 2)], 4)
    bad_table(batch, how)
    kv = torch.randn(batch.num_pages, 2, 4, 2, 8)
    before = kv.clone()
    k = torch.randn(5, 2, 8)
    with pytest.raises(PageTableError):
        write_kv(kv, k, k, *indices(batch, "cpu"), host=host_rows(batch, pages_checked=False))
    assert torch.equal(kv, before)


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
@pytest.mark.parametrize("how", ["minus_one", "past_table"])
def test_table_wrongly_claimed_checked_fails_loudly(how: str, contiguous: bool) -> None:
    """Skipping the check is for tables the caller validated; a bad one must still never land a token in a
    page that is not its row's (CPU only: on CUDA the same write is a device assert)."""
    batch = make_batch([(2, 3), (4, 2)], 4)
    own = {(int(p), off) for row, pos, _ in batch.token_rows() for p, off in [batch.slot(row, pos)] if p >= 0}
    bad_table(batch, how)
    if contiguous:
        kv = torch.randn(batch.num_pages, 2, 4, 2, 8)
    else:
        kv = torch.randn(2 * batch.num_pages, 2, 4, 2, 8)[::2]
    before = kv.clone()
    k = torch.randn(5, 2, 8)
    with pytest.raises(IndexError):
        write_kv(kv, k, k, *indices(batch, "cpu"), host=host_rows(batch, pages_checked=True))
    changed = {(p, off) for p, _, off in (kv != before).any(-1).any(-1).nonzero().tolist()}
    assert changed <= own


UNIFORM = {"decode": [(13, 1), (40, 1), (2, 1)], "verify": [(21, 4), (3, 4), (9, 4)]}


@pytest.mark.parametrize("kind", UNIFORM)
def test_uniform_rows_without_lengths_match_and_read_nothing_back(kind: str, device: str) -> None:
    """A decode / verify step whose lengths are not known on the host (inside a CUDA graph): one group padded
    to the page table's width gives the attention of the known-lengths path, with no host sync."""
    batch = make_batch(UNIFORM[kind], 4, seed=3)
    T = UNIFORM[kind][0][1]
    blind = HostRows(None, None, pages_checked=True, uniform_new=T)
    (q, k, v), kv = gqa_case(batch, device)
    inputs = mla_t.make_inputs(batch, torch.float32)
    mla_args = [mla_t.flat_new(batch, inputs[x]).to(device) for x in ("q_nope", "q_rope", "latent", "k_rope")]
    pages = mla_t.make_pages(batch, inputs, torch.float32).to(device)
    w_k, w_v = (w.to(device) for w in mla_t.make_weights())
    want_gqa = paged_attention(q, k, v, kv.clone(), *indices(batch, device), host=host_rows(batch, True))
    want_mla = mla_paged_attention(*mla_args, pages.clone(), *indices(batch, device), w_k, w_v,
                                   host=host_rows(batch, True))
    with no_host_sync() if device == "cpu" else torch.no_grad():
        got_mla = mla_paged_attention(*mla_args, pages, *indices(batch, device), w_k, w_v, host=blind)
        got_gqa = paged_attention(q, k, v, kv, *indices(batch, device), host=blind)
    torch.testing.assert_close(got_mla, want_mla, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_gqa, want_gqa, atol=1e-5, rtol=1e-5)
