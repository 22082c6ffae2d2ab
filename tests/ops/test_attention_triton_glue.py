"""Triton KV / latent writes and MLA decode vs the torch paths: pages bit-exact, outputs within tolerance.

Runs on CUDA, or on CPU tensors in Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py).
Cases: padding rows, idle rows, rows whose new tokens cross a page boundary, a trailing -1 column in the
page table, stale NaN in every slot a row does not own, key splits and query blocks, dtype conversion.
"""

from __future__ import annotations

import os

import pytest
import torch

from hybridcache.ops.attention import HostRows, PageTableError, mla_paged_attention, naive, write_kv, write_latent
from tests.ops.test_attention import MIXED, TOL, make_batch, make_pool, make_sequences
from tests.ops.test_attention_mla import DR, H, R, flat_new, make_inputs, make_pages, make_weights, run

triton_write = pytest.importorskip("hybridcache.ops.attention.triton_write", reason="triton is not installed")
from hybridcache.ops.attention import mla, paged, triton_mla  # noqa: E402
from hybridcache.ops.triton_support import kernels_on_cpu  # noqa: E402
from tests.ops.dispatch import record_calls  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if torch.cuda.is_available() and not INTERPRET:
    DEVICE = "cuda"
elif INTERPRET:
    DEVICE = "cpu"
else:
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 for the CPU interpreter", allow_module_level=True)

# (cached, new) per row, None pads: decode and verify rows crossing page boundaries (page sizes 4, 5, 16)
CROSSING = [(3, 2), None, (15, 1), (7, 0), (14, 4), (0, 1), (19, 3)]
DECODE = [(0, 1), (15, 1), None, (16, 1), (37, 1), (70, 1)]
VERIFY = [(0, 4), (12, 4), (29, 4), (7, 0), (64, 4), None]
CHECKED = HostRows(None, None, pages_checked=True)


def on(device: str, *ts: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(device) for t in ts]


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [CROSSING, MIXED], ids=["crossing", "mixed"])
@pytest.mark.parametrize("page_size", [4, 5, 16])
def test_write_kv_matches_torch_bit_exact(page_size: int, rows, pool_dtype: torch.dtype) -> None:
    batch = make_batch(rows, page_size, seed=page_size)
    seqs = make_sequences(batch, 4, 2, 24, torch.float32)
    torch_pool = make_pool(batch, seqs, 2, 24, pool_dtype, fill=float("nan"))
    kernel_pool = torch_pool.clone().to(DEVICE)
    k, v = seqs.flat_new(batch, "k"), seqs.flat_new(batch, "v")
    idx = (batch.page_table, batch.cached_lens, batch.cu_seqlens)
    write_kv(torch_pool, k, v, *idx)  # fp32 values into the pool's dtype: the same rounding both ways
    triton_write.write_kv_triton(kernel_pool, *on(DEVICE, k, v, *idx))
    assert torch.equal(kernel_pool.cpu().nan_to_num(7.0), torch_pool.nan_to_num(7.0))


@pytest.mark.parametrize("page_size", [4, 16])
def test_write_latent_matches_torch_bit_exact(page_size: int) -> None:
    batch = make_batch(CROSSING, page_size, seed=3)
    inputs = make_inputs(batch, torch.bfloat16)
    torch_pages = make_pages(batch, inputs, torch.bfloat16, fill=float("nan"))
    kernel_pages = torch_pages.clone().to(DEVICE)
    # the rope key as the model has it: a column slice of the projection's output (row stride R + Dr)
    proj = torch.cat([flat_new(batch, inputs["latent"]), flat_new(batch, inputs["k_rope"])], dim=-1)
    latent, k_rope = proj.split([R, DR], dim=-1)
    idx = (batch.page_table, batch.cached_lens, batch.cu_seqlens)
    write_latent(torch_pages, latent, k_rope, *idx)
    triton_write.write_latent_triton(kernel_pages, *on(DEVICE, latent, k_rope, *idx))
    assert torch.equal(kernel_pages.cpu().nan_to_num(7.0), torch_pages.nan_to_num(7.0))


def test_write_into_strided_pool_slice_and_token_without_page_writes_nothing() -> None:
    """One layer of a [L, P, 2, page, Hkv, D] pool; a token whose page is -1 or past the table lands nowhere
    (only reachable with a wrongly checked table: the kernel path must not corrupt a page then)."""
    batch = make_batch([(3, 2), (1, 2)], 4, spare_pages=2)
    batch.page_table[0, 1] = -1  # row 0's token at position 4
    batch.page_table[1, -1] = 5
    pool = torch.zeros(2, batch.num_pages, 2, 4, 2, 8, device=DEVICE)
    k, v = torch.ones(4, 2, 8, device=DEVICE), torch.full((4, 2, 8), 2.0, device=DEVICE)
    triton_write.write_kv_triton(pool[1], k, v, *on(DEVICE, batch.page_table, batch.cached_lens, batch.cu_seqlens))
    expected = torch.zeros_like(pool)
    for row, pos, _ in batch.token_rows():
        if (row, pos) != (0, 4):
            page, off = batch.slot(row, pos)
            expected[1, page, 0, off], expected[1, page, 1, off] = 1.0, 2.0
    assert torch.equal(pool, expected)


def test_kernel_path_only_for_a_checked_table() -> None:
    """Inside kernels_on_cpu a checked step takes the kernel; an unchecked one keeps the torch path,
    which raises PageTableError and writes nothing."""
    if DEVICE != "cpu":
        pytest.skip("kernels_on_cpu is the interpreter's dispatch")
    batch = make_batch([(3, 2)], 4)
    idx = (batch.page_table, batch.cached_lens, batch.cu_seqlens)
    kv = torch.zeros(batch.num_pages, 2, 4, 2, 8)
    pages = torch.zeros(batch.num_pages, 4, R + DR)
    with kernels_on_cpu():
        assert paged.write_triton(kv, kv) and mla.use_triton(torch.zeros(2, H, 4), pages, batch.page_table)
        write_kv(kv, torch.ones(2, 2, 8), torch.ones(2, 2, 8), *idx, host=CHECKED)
        write_latent(pages, torch.ones(2, R), torch.ones(2, DR), *idx, host=CHECKED)
        assert int(kv.count_nonzero()) == 2 * 2 * 2 * 8 and int(pages.count_nonzero()) == 2 * (R + DR)
        batch.page_table[0, 1] = -1
        for host in (None, HostRows(None, None)):
            with pytest.raises(PageTableError):
                write_kv(kv.zero_(), torch.ones(2, 2, 8), torch.ones(2, 2, 8), *idx, host=host)
            with pytest.raises(PageTableError):
                write_latent(pages.zero_(), torch.ones(2, R), torch.ones(2, DR), *idx, host=host)
            assert not kv.any() and not pages.any()


def mla_case(rows, page_size: int, dtype: torch.dtype, **kw) -> None:
    batch = make_batch(rows, page_size, seed=page_size + len(rows))
    inputs = make_inputs(batch, dtype, seed=len(rows))
    w_k, w_v = (w.to(dtype) for w in make_weights(page_size))
    pages = make_pages(batch, inputs, dtype, fill=float("nan"))  # stale NaN wherever a row has no token
    want = run(naive.mla_paged_attention, batch, inputs, pages, w_k, w_v)  # writes the new latents
    q_nope, q_rope = (flat_new(batch, inputs[x]) for x in ("q_nope", "q_rope"))
    scale = (q_nope.shape[-1] + DR) ** -0.5
    q_lat = torch.einsum("nhd,hdr->nhr", q_nope.float(), w_k.float()).to(dtype)
    idx = on(DEVICE, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    o_lat = triton_mla.mla_attend_triton(*on(DEVICE, q_lat, q_rope, pages), *idx, scale, **kw)
    got = torch.einsum("nhr,hvr->nhv", o_lat.cpu().float(), w_v.float()).to(dtype)
    torch.testing.assert_close(got, want, **TOL[dtype])
    glue = mla.absorbed_triton(*on(DEVICE, q_nope, q_rope, pages), *idx, *on(DEVICE, w_k, w_v), scale)
    torch.testing.assert_close(glue.cpu(), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [16, 5])
@pytest.mark.parametrize("rows", [DECODE, VERIFY, CROSSING], ids=["decode", "verify", "crossing"])
def test_mla_kernel_matches_naive(rows, page_size: int, dtype: torch.dtype) -> None:
    """R = 24 and Dr = 8 (test_attention_mla's shapes) are not powers of two: masked tiles."""
    mla_case(rows, page_size, dtype)


@pytest.mark.parametrize("num_splits,block_t,block_n", [(3, 1, 16), (8, 2, 16), (1, 4, 16), (2, 1, 32), (1, 2, 64)])
def test_mla_key_splits_query_blocks_and_key_steps_do_not_change_the_result(num_splits: int, block_t: int,
                                                                             block_n: int) -> None:
    """Key steps wider than a page (16) and than a row's keys, and than a split's share of them."""
    mla_case(VERIFY + [(5, 1)], 16, torch.float32, num_splits=num_splits, block_t=block_t, block_n=block_n,
             num_warps=4 if block_n == 32 else None, num_stages=2 if block_n == 64 else None)


def test_mla_glue_matches_torch_absorbed_path_through_the_dispatch() -> None:
    """mla_paged_attention on the kernel path (write kernel + MLA kernel) == the torch path: same pages
    bit for bit, outputs within tolerance; a prefill-heavy step keeps the torch path."""
    if DEVICE != "cpu":
        pytest.skip("kernels_on_cpu is the interpreter's dispatch")
    batch = make_batch(CROSSING, 4, seed=11)
    inputs = make_inputs(batch, torch.float32, seed=12)
    w_k, w_v = make_weights(3)
    torch_pages = make_pages(batch, inputs, torch.float32, fill=float("nan"))
    kernel_pages = torch_pages.clone()
    want = run(mla_paged_attention, batch, inputs, torch_pages, w_k, w_v, absorb=True)
    with kernels_on_cpu():
        assert mla.use_triton(inputs["q_nope"][0], kernel_pages, batch.page_table)
        got = run(mla_paged_attention, batch, inputs, kernel_pages, w_k, w_v, host=CHECKED)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert torch.equal(kernel_pages.nan_to_num(7.0), torch_pages.nan_to_num(7.0))
    assert not mla.use_triton(torch.zeros(17 * 7 + 1, H, 4), kernel_pages, batch.page_table)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mla_one_query_row_takes_the_batched_gemv(monkeypatch, dtype: torch.dtype) -> None:
    """One new token (batch-1 decode) with `linear.BATCHED_GEMV`: the absorbed form's two batched products are
    `bmm_rows_triton` launches (the key weight read as a transposed view, in place), its output the naive
    reference's within tolerance; a verify row (4 tokens) keeps torch.bmm."""
    from hybridcache.ops import gemv_triton, linear

    calls = record_calls(monkeypatch, gemv_triton, "bmm_rows_triton")
    monkeypatch.setattr(linear, "BATCHED_GEMV", True)
    for rows, launches in (([(37, 1)], 2), ([(12, 4)], 0)):
        calls.clear()
        batch = make_batch(rows, 16, seed=21)
        inputs = make_inputs(batch, dtype, seed=22)
        w_k, w_v = (w.to(dtype) for w in make_weights(16))
        pages = make_pages(batch, inputs, dtype, fill=float("nan"))
        want = run(naive.mla_paged_attention, batch, inputs, pages, w_k, w_v)
        q_nope, q_rope = (flat_new(batch, inputs[x]) for x in ("q_nope", "q_rope"))
        idx = on(DEVICE, batch.page_table, batch.cached_lens, batch.cu_seqlens)
        with kernels_on_cpu() if DEVICE == "cpu" else torch.no_grad():
            got = mla.absorbed_triton(*on(DEVICE, q_nope, q_rope, pages), *idx, *on(DEVICE, w_k, w_v),
                                      (q_nope.shape[-1] + DR) ** -0.5)
        assert calls == ["bmm_rows_triton"] * launches, rows
        torch.testing.assert_close(got.cpu(), want, **TOL[dtype])


@pytest.mark.skipif(DEVICE != "cuda", reason="sync checks need CUDA")
def test_kernel_paths_make_no_host_sync() -> None:
    batch = make_batch(VERIFY, 16)
    inputs = {k: [t.cuda() for t in v] for k, v in make_inputs(batch, torch.bfloat16).items()}
    w_k, w_v = (w.to("cuda", torch.bfloat16) for w in make_weights())
    pages = make_pages(batch, inputs, torch.bfloat16).cuda()
    for name in ("page_table", "cached_lens", "cu_seqlens"):
        setattr(batch, name, getattr(batch, name).cuda())
    seqs = make_sequences(batch, 8, 2, 64, torch.bfloat16)
    kv = make_pool(batch, seqs, 2, 64, torch.bfloat16).cuda()
    q, k, v = (seqs.flat_new(batch, x).cuda() for x in "qkv")
    idx = (batch.page_table, batch.cached_lens, batch.cu_seqlens)

    def step() -> None:
        run(mla_paged_attention, batch, inputs, pages, w_k, w_v, host=CHECKED)
        paged.paged_attention(q, k, v, kv, *idx, host=CHECKED)

    step()  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,rotary", [(24, 8), (32, 32)])
def test_norm_rope_matches_the_torch_norms_and_rotation(head_dim: int, rotary: int, dtype: torch.dtype) -> None:
    """Qwen3-Next's q / k preprocessing in one launch == RMSNorm (1 + w) then PartialRoPE; q a strided view
    of the fused projection (gate channels between heads), as the layer passes it. fp32 to rounding;
    bf16 within 2 ulps (the interpreter truncates where the GPU rounds to nearest even)."""
    from hybridcache.models.layers.norm import RMSNorm
    from hybridcache.models.layers.rope import PartialRoPE
    from hybridcache.ops.attention.triton_norm_rope import norm_rope_triton

    n, hq, hkv = 5, 3, 2
    gen = torch.Generator().manual_seed(head_dim)
    proj = (torch.randn(n, hq * 2 * head_dim + hkv * head_dim, generator=gen) * 3).to(dtype)
    q = proj[:, : hq * 2 * head_dim].view(n, hq, 2 * head_dim)[..., :head_dim]
    k = proj[:, hq * 2 * head_dim :].view(n, hkv, head_dim)
    norms = [RMSNorm(head_dim, 1e-6, "cpu", dtype, zero_centred=True) for _ in range(2)]
    with torch.no_grad():
        for norm in norms:
            norm.weight.normal_(generator=gen)
    rope = PartialRoPE(head_dim, rotary, 1e4, "cpu")
    positions = torch.tensor([0, 3, 17, 100, 2000])
    cos_sin = rope.cos_sin(positions, dtype)
    want = rope(norms[0](q), *cos_sin), rope(norms[1](k), *cos_sin)
    got = norm_rope_triton(*on(DEVICE, q, k, norms[0].weight, norms[1].weight), 1e-6, *on(DEVICE, positions,
                           rope.inv_freq), rotary)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else TOL[dtype]
    for g, w in zip(got, want):
        assert g.dtype == dtype and g.is_contiguous() and g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w, **tol)


def test_mla_kernel_at_kimi_shapes() -> None:
    """H = 16, R = 512, Dr = 64, page size 16 (the 1B checkpoint's): o_lat == dense softmax over each
    row's latents, fp32; decode rows and a verify row, one of them crossing a page boundary."""
    heads, rank, rope = 16, 512, 64
    batch = make_batch([(15, 1), (40, 3), None, (3, 1)], 16, seed=5)
    gen = torch.Generator().manual_seed(5)
    pages = torch.randn(batch.num_pages, 16, rank + rope, generator=gen)
    n = batch.num_new
    q_lat, q_rope = torch.randn(n, heads, rank, generator=gen) * 0.05, torch.randn(n, heads, rope, generator=gen)
    scale = 192 ** -0.5
    got = triton_mla.mla_attend_triton(*on(DEVICE, q_lat, q_rope, pages, batch.page_table, batch.cached_lens,
                                           batch.cu_seqlens), scale).cpu()
    for row, pos, i in batch.token_rows():
        keys = torch.stack([pages[batch.slot(row, p)] for p in range(pos + 1)])  # [pos + 1, R + Dr]
        probs = torch.softmax(torch.cat([q_lat[i], q_rope[i]], -1) @ keys.T * scale, dim=-1)
        torch.testing.assert_close(got[i], probs @ keys[:, :rank], **TOL[torch.float32])
