"""MLA over paged latents: writes follow the layout; absorbed == expanded == naive == dense expanded;
chunked paged steps == transformers' KimiLinearAttention on the same weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridcache.ops.attention import PageTableError, mla_paged_attention, naive, write_latent
from tests.ops.test_attention import MIXED, TOL, WITH_LONG, Batch, make_batch

H, DN, DR, R, DV = 4, 16, 8, 24, 12


def make_weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """w_k [H, Dn, R], w_v [H, Dv, R] as split from a kv_b_proj weight [H * (Dn + Dv), R]."""
    weight = torch.randn(H * (DN + DV), R, generator=torch.Generator().manual_seed(seed)) * R**-0.5
    w_k, w_v = weight.view(H, DN + DV, R).split([DN, DV], dim=1)
    return w_k, w_v


def make_inputs(batch: Batch, dtype: torch.dtype, seed: int = 1) -> dict[str, list[torch.Tensor]]:
    """Full sequences per row: q_nope, q_rope, latent, k_rope."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [0 if r is None else r[0] + r[1] for r in batch.rows]
    shapes = {"q_nope": (H, DN), "q_rope": (H, DR), "latent": (R,), "k_rope": (DR,)}
    return {name: [torch.randn(n, *shape, generator=gen).to(dtype) for n in lengths] for name, shape in shapes.items()}


def flat_new(batch: Batch, seqs: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([seqs[b][spec[0] :] for b, spec in enumerate(batch.rows) if spec is not None])


def make_pages(batch: Batch, inputs: dict, dtype: torch.dtype, fill: float | None = None) -> torch.Tensor:
    shape = (batch.num_pages, batch.page_size, R + DR)
    pages = torch.randn(shape, generator=torch.Generator().manual_seed(9)) if fill is None else torch.full(shape, fill)
    pages = pages.to(dtype)
    for b, spec in enumerate(batch.rows):
        for pos in range(0 if spec is None else spec[0]):
            page, off = batch.slot(b, pos)
            pages[page, off] = torch.cat([inputs["latent"][b][pos], inputs["k_rope"][b][pos]])
    return pages


def dense_expanded(batch: Batch, inputs: dict, w_k: torch.Tensor, w_v: torch.Tensor) -> torch.Tensor:
    """Outside oracle: expand each full sequence's latents to per-head k/v, dense causal SDPA in fp32."""
    outs = []
    for b, spec in enumerate(batch.rows):
        if spec is None or spec[1] == 0:
            continue
        c = inputs["latent"][b].float()
        n = c.shape[0]
        k_nope = torch.einsum("nr,hdr->nhd", c, w_k)
        k = torch.cat([k_nope, inputs["k_rope"][b].float()[:, None].expand(n, H, DR)], dim=-1)
        v = torch.einsum("nr,hdr->nhd", c, w_v)
        q = torch.cat([inputs["q_nope"][b], inputs["q_rope"][b]], dim=-1).float()
        o = F.scaled_dot_product_attention(*(x.transpose(0, 1) for x in (q, k, v)), is_causal=True)
        outs.append(o.transpose(0, 1)[spec[0] :])
    return torch.cat(outs)


def run(fn, batch: Batch, inputs: dict, pages: torch.Tensor, w_k, w_v, **kw) -> torch.Tensor:
    args = [flat_new(batch, inputs[x]) for x in ("q_nope", "q_rope", "latent", "k_rope")]
    return fn(*args, pages, batch.page_table, batch.cached_lens, batch.cu_seqlens, w_k, w_v, **kw)


@pytest.mark.parametrize("impl", [write_latent, naive.write_latent], ids=["fast", "naive"])
def test_write_latent_lands_where_layout_says(impl) -> None:
    batch = make_batch(WITH_LONG, 4)
    inputs = make_inputs(batch, torch.float32)
    pages = make_pages(batch, inputs, torch.float32)
    expected = pages.clone()
    latent, k_rope = flat_new(batch, inputs["latent"]), flat_new(batch, inputs["k_rope"])
    for row, pos, n in batch.token_rows():
        page, off = batch.slot(row, pos)
        expected[page, off, :R], expected[page, off, R:] = latent[n], k_rope[n]
    impl(pages, latent, k_rope, batch.page_table, batch.cached_lens, batch.cu_seqlens)
    assert torch.equal(pages, expected)


def test_write_latent_without_page_raises() -> None:
    batch = make_batch([(3, 2)], 4)
    batch.page_table[0, 1] = -1
    pages = torch.zeros(batch.num_pages, 4, R + DR)
    with pytest.raises(PageTableError):
        write_latent(pages, torch.ones(2, R), torch.ones(2, DR), batch.page_table, batch.cached_lens, batch.cu_seqlens)
    assert not pages.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize("absorb", [None, True, False])
def test_fast_matches_naive(absorb: bool | None, page_size: int, dtype: torch.dtype, device: str) -> None:
    batch = make_batch(WITH_LONG, page_size, seed=page_size)
    inputs = {name: [t.to(device) for t in seqs] for name, seqs in make_inputs(batch, dtype).items()}
    w_k, w_v = (w.to(device) for w in make_weights())
    pages_fast, pages_naive = (make_pages(batch, inputs, dtype).to(device) for _ in range(2))
    for name in ("page_table", "cached_lens", "cu_seqlens"):
        setattr(batch, name, getattr(batch, name).to(device))
    out_fast = run(mla_paged_attention, batch, inputs, pages_fast, w_k, w_v, absorb=absorb)
    out_naive = run(naive.mla_paged_attention, batch, inputs, pages_naive, w_k, w_v)
    assert out_fast.dtype == dtype and out_fast.shape == (batch.num_new, H, DV)
    torch.testing.assert_close(out_fast, out_naive, **TOL[dtype])
    assert torch.equal(pages_fast, pages_naive)


@pytest.mark.parametrize("absorb", [None, True, False])
def test_matches_dense_expanded_with_stale_nan(absorb: bool | None) -> None:
    batch = make_batch(MIXED, 4, seed=2)
    inputs = make_inputs(batch, torch.float32, seed=3)
    w_k, w_v = make_weights(1)
    pages = make_pages(batch, inputs, torch.float32, fill=float("nan"))
    out = run(mla_paged_attention, batch, inputs, pages, w_k, w_v, absorb=absorb)
    torch.testing.assert_close(out, dense_expanded(batch, inputs, w_k, w_v), **TOL[torch.float32])


def test_naive_matches_dense_expanded() -> None:
    batch = make_batch(WITH_LONG, 16, seed=4)
    inputs = make_inputs(batch, torch.float32, seed=5)
    w_k, w_v = make_weights(2)
    out = run(naive.mla_paged_attention, batch, inputs, make_pages(batch, inputs, torch.float32), w_k, w_v)
    torch.testing.assert_close(out, dense_expanded(batch, inputs, w_k, w_v), **TOL[torch.float32])


def test_chunked_steps_match_transformers_kimi_linear_attention() -> None:
    """Prefill 7 tokens, decode 1, verify 4 through pages; o_proj of our output equals the module's
    forward over all 12 tokens at once."""
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearAttention

    torch.manual_seed(0)
    config = KimiLinearConfig(
        hidden_size=64, num_attention_heads=H, num_key_value_heads=H, kv_lora_rank=R, qk_rope_head_dim=DR,
        qk_nope_head_dim=DN, v_head_dim=DV, q_lora_rank=None, num_hidden_layers=2,
        linear_attn_config={"kda_layers": [1], "full_attn_layers": [2], "head_dim": 16, "num_heads": 4,
                            "short_conv_kernel_size": 4},
    )
    config._attn_implementation = "eager"
    module = KimiLinearAttention(config, layer_idx=1).eval()
    with torch.no_grad():
        module.kv_a_layernorm.weight.uniform_(0.5, 1.5)
    hidden = torch.randn(2, 12, 64)
    causal = torch.full((12, 12), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected, _ = module(hidden, attention_mask=causal)
        q = module.q_proj(hidden).view(2, 12, H, DN + DR)
        latent, k_rope = module.kv_a_proj_with_mqa(hidden).split([R, DR], dim=-1)
        latent = module.kv_a_layernorm(latent)
        w_k, w_v = module.kv_b_proj.weight.view(H, DN + DV, R).split([DN, DV], dim=1)
        batch = make_batch([(0, 12), (0, 12)], 4)
        pages = torch.full((batch.num_pages, 4, R + DR), float("nan"))
        outs = []
        for lo, hi in [(0, 7), (7, 8), (8, 12)]:
            flat = lambda x: x[:, lo:hi].flatten(0, 1)  # noqa: E731
            cu = torch.tensor([0, hi - lo, 2 * (hi - lo)], dtype=torch.int32)
            cached = torch.tensor([lo, lo], dtype=torch.int32)
            o = mla_paged_attention(flat(q[..., :DN]), flat(q[..., DN:]), flat(latent), flat(k_rope), pages,
                                    batch.page_table, cached, cu, w_k, w_v, scale=module.scaling)
            outs.append(o.view(2, hi - lo, H * DV))
        got = module.o_proj(torch.cat(outs, dim=1))
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
