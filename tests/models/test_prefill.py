"""Prefill logits equal transformers' full forward, over patterns, group counts and chunkings."""
import pytest
import torch

from hybridcache.models import load_model

from .helpers import Driver, reference_logits, save_tiny

CONFIGS = {
    "M*-E, 2 groups, chunk 4": dict(hybrid_override_pattern="M*-E", n_groups=2, chunk_size=4),
    "MM*M-, 1 group, chunk 8": dict(hybrid_override_pattern="MM*M-", n_groups=1, chunk_size=8, conv_kernel=3),
    "*EM-ME, 4 groups, biases, grouped router, latent MoE": dict(
        hybrid_override_pattern="*EM-ME", n_groups=4, chunk_size=5, use_bias=True, mlp_bias=True,
        use_conv_bias=False, n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=3,
        moe_latent_size=16, routed_scaling_factor=2.5,
    ),
    "attention only": dict(hybrid_override_pattern="*-*", num_key_value_heads=4),
    "mamba only": dict(hybrid_override_pattern="MEM", mamba_num_heads=8, mamba_head_dim=4, chunk_size=3),
}


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_prefill_matches_transformers(tmp_path, overrides, device):
    path, hf = save_tiny(tmp_path, **overrides)
    model = load_model(path, device=device)
    g = torch.Generator().manual_seed(1)
    prompts = {"a": torch.randint(0, 96, (13,), generator=g), "b": torch.randint(0, 96, (6,), generator=g)}
    drv = Driver(model, device=device)
    logits = drv.prefill({r: p.tolist() for r, p in prompts.items()})
    for (r, p), got in zip(prompts.items(), logits):
        torch.testing.assert_close(got, reference_logits(hf, p), atol=1e-4, rtol=0, msg=f"request {r}")
