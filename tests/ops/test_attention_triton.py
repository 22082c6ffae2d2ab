"""Triton paged attention vs naive: GQA ratios, page sizes, decode and verify rows, empty prefixes.

Runs on CUDA, or on CPU tensors in Triton's interpreter when TRITON_INTERPRET=1 is set before pytest
starts; skipped when triton does not import (the project venv has none) or neither applies.
Tolerances: fp32 2e-5 abs / 1e-4 rel (ieee dots, fp32 softmax); bf16 2e-2 / 2e-2 (bf16 inputs,
probabilities rounded to bf16 before the value product, as in the torch path's SDPA).
"""

from __future__ import annotations

import os

import pytest
import torch

from hybridcache.ops.attention import naive
from tests.ops.test_attention import TOL, dense_reference, make_batch, make_pool, make_sequences

triton_paged = pytest.importorskip("hybridcache.ops.attention.triton_paged", reason="triton is not installed")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if torch.cuda.is_available() and not INTERPRET:
    DEVICE = "cuda"
elif INTERPRET:
    DEVICE = "cpu"
else:
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 for the CPU interpreter", allow_module_level=True)

attend = triton_paged.attend_kv_pages_triton
# decode rows (T = 1) and verify rows (T = 4), prefixes from 0 across page boundaries; None pads.
DECODE = [(0, 1), (15, 1), (16, 1), (37, 1), None, (70, 1)]
VERIFY = [(0, 4), (12, 4), (29, 4), (7, 0), (64, 4)]
MIXED = [(0, 1), (21, 4), None, (3, 4), (40, 1), (0, 4)]


def run_case(rows, page_size: int, group: int, dtype: torch.dtype, hkv: int = 2, d: int = 32, **kw) -> None:
    batch = make_batch(rows, page_size, seed=group + page_size)
    seqs = make_sequences(batch, hkv * group, hkv, d, dtype, seed=len(rows))
    # Stale NaN everywhere a row does not own: the kernel must never let it through.
    kv = make_pool(batch, seqs, hkv, d, dtype, fill=float("nan"))
    q, k, v = (seqs.flat_new(batch, x) for x in "qkv")
    idx = (batch.page_table, batch.cached_lens, batch.cu_seqlens)
    want = naive.paged_attention(q, k, v, kv, *idx)  # writes the new tokens into kv, then attends
    got = attend(q.to(DEVICE), kv.to(DEVICE), *(t.to(DEVICE) for t in idx), **kw)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, **TOL[dtype])
    if dtype == torch.float32:
        torch.testing.assert_close(got.cpu(), dense_reference(batch, seqs), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [16, 5])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("rows", [DECODE, VERIFY, MIXED], ids=["decode", "verify", "mixed"])
def test_matches_naive(rows, group: int, page_size: int, dtype: torch.dtype) -> None:
    run_case(rows, page_size, group, dtype)


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("block_t", [1, 2, 4, 16])
def test_key_splits_and_query_blocks_do_not_change_the_result(num_splits: int, block_t: int) -> None:
    """Splits more than keys (empty splits), query blocks smaller than a row's tokens (several blocks)."""
    run_case(VERIFY + [(5, 1)], 16, 2, torch.float32, num_splits=num_splits, block_t=block_t)


@pytest.mark.parametrize("block_n", [16, 32, 128])
def test_key_steps_do_not_change_the_result(block_n: int) -> None:
    """Key steps of one page and of several, and wider than every row's keys."""
    run_case(VERIFY + [(5, 1)], 16, 2, torch.float32, num_splits=2, block_n=block_n)


def test_long_prefill_row_and_odd_head_dim() -> None:
    """The kernel is correct for any row; D = 24 pads to a 32-lane tile; group 3 pads the tile rows."""
    run_case([(0, 23), (9, 1), (30, 17)], 5, 3, torch.float32, d=24)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_a_row_without_pages_reads_nothing(num_splits: int) -> None:
    """A graph step's padding row (`engine.graphs`): tokens at positions past an empty prefix, page table all
    -1. Its output is zeros, not a read of page -1 or of the pool's stale NaN, and the other rows' outputs
    are those of the step without it."""
    rows = VERIFY[:3]
    batch = make_batch(rows, 16, seed=3)
    seqs = make_sequences(batch, 4, 2, 32, torch.float32, seed=3)
    kv = make_pool(batch, seqs, 2, 32, torch.float32, fill=float("nan"))
    q, k, v = (seqs.flat_new(batch, x) for x in "qkv")
    want = naive.paged_attention(q, k, v, kv, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    t = rows[0][1]
    table = torch.cat([batch.page_table, torch.full((1, batch.page_table.shape[1]), -1, dtype=torch.int32)])
    cached = torch.cat([batch.cached_lens, torch.tensor([0], dtype=torch.int32)])
    cu = torch.cat([batch.cu_seqlens, batch.cu_seqlens[-1:] + t])
    padded_q = torch.cat([q, torch.randn(t, *q.shape[1:])])
    got = attend(padded_q.to(DEVICE), kv.to(DEVICE), *(x.to(DEVICE) for x in (table, cached, cu)),
                 num_splits=num_splits)
    torch.testing.assert_close(got[: len(q)].cpu(), want, **TOL[torch.float32])
    assert torch.equal(got[len(q):].cpu(), torch.zeros(t, *q.shape[1:]))


def test_empty_step() -> None:
    batch = make_batch([None, (4, 0)], 16)
    kv = torch.zeros(batch.num_pages, 2, 16, 2, 32, device=DEVICE)
    q = torch.zeros(0, 4, 32, device=DEVICE)
    out = attend(q, kv, *(t.to(DEVICE) for t in (batch.page_table, batch.cached_lens, batch.cu_seqlens)))
    assert out.shape == (0, 4, 32)


@pytest.mark.skipif(DEVICE != "cuda", reason="dispatch and sync checks need CUDA")
def test_fast_path_dispatches_to_triton_without_host_sync() -> None:
    from hybridcache.ops.attention import paged

    batch = make_batch(MIXED, 16)
    seqs = make_sequences(batch, 8, 2, 64, torch.bfloat16)
    kv = make_pool(batch, seqs, 2, 64, torch.bfloat16).cuda()
    q, k, v = (seqs.flat_new(batch, x).cuda() for x in "qkv")
    idx = [t.cuda() for t in (batch.page_table, batch.cached_lens, batch.cu_seqlens)]
    paged.write_kv(kv, k, v, *idx)
    assert paged.use_triton(q, kv, idx[0])
    attend(q, kv, *idx)  # compile outside the sync check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = paged.attend_kv_pages(q, kv, *idx)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = paged.attend_kv_pages_torch(q, kv, *idx)
    torch.testing.assert_close(got, want, **TOL[torch.bfloat16])


@pytest.mark.parametrize("min_keys", [256, 16])
def test_the_default_splits_follow_min_keys_per_split(monkeypatch, min_keys: int) -> None:
    """The split count a launch takes by default reads MIN_KEYS_PER_SPLIT when it runs (so a setting can be
    timed by changing it), and the result stays the naive one at either."""
    monkeypatch.setattr(triton_paged, "MIN_KEYS_PER_SPLIT", min_keys)
    seen = []
    real = triton_paged.split_buffers
    monkeypatch.setattr(triton_paged, "split_buffers", lambda splits, out: seen.append(splits) or real(splits, out))
    run_case([(70, 1)], 16, 2, torch.float32)
    # one row of 70 cached keys and one new one over 16-key pages, a table of 5 pages (80 keys): one split at 256
    # keys a split; at 16, up to 5 (4 in the interpreter, which counts 4 SMs: 8 programs over 2 kv heads)
    assert len(seen) == 1 and (seen[0] == 1 if min_keys == 256 else seen[0] > 1)
