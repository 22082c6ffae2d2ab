"""Tiny NemotronH checkpoints built with transformers, their reference logits, and a manager-driven runner."""
from __future__ import annotations

from pathlib import Path

import torch

from hybridcache.cache import CacheConfig, HybridCacheManager
from hybridcache.engine.forward import forward_batch
from hybridcache.states import KVPages

TINY = dict(
    vocab_size=96, hidden_size=32, hybrid_override_pattern="M*-E", num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, intermediate_size=48, mamba_num_heads=4, mamba_head_dim=8, n_groups=2, ssm_state_size=8,
    conv_kernel=4, chunk_size=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
    moe_shared_expert_intermediate_size=24,
)


def save_tiny(path: Path, seed: int = 0, **overrides) -> tuple[Path, torch.nn.Module]:
    """Save a seeded tiny NemotronH to `path`; returns (path, the transformers model in eval mode).

    Vector parameters and buffers (norm weights, biases, D, dt_bias, A_log, router bias) get noise so that
    their ones / zeros initialisations cannot hide a missing term; the LM head is scaled by 8.
    """
    from transformers import NemotronHConfig, NemotronHForCausalLM

    torch.manual_seed(seed)
    model = NemotronHForCausalLM(NemotronHConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.ndim == 1 and t.is_floating_point():
                t.add_(0.1 * torch.randn_like(t))
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    return path, model


def reference_logits(hf_model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """transformers' full-sequence forward. ids: [L] -> [L, V] fp32."""
    with torch.no_grad():
        return hf_model(ids[None], use_cache=False).logits[0].float()


class Driver:
    """Runs steps of our model through a HybridCacheManager the way the engine will."""

    def __init__(self, model, num_draft_tokens: int = 0, num_slots: int = 4, page_size: int = 4,
                 device: str = "cpu") -> None:
        self.model, self.page_size, self.device = model, page_size, device
        config = CacheConfig(device_bytes=1 << 22, host_bytes=1 << 22, num_slots=num_slots, page_size=page_size,
                             device=device)
        pages = model.page_roles(page_size)
        if pages is None:
            # the manager still counts pages for requests when it has no page roles (it then has 0 pages and
            # refuses every step); a 1-element page role the model never reads works around it
            pages = KVPages(1, 1, 1, page_size, torch.float32)
        self.mgr = HybridCacheManager(model.state_modules(num_draft_tokens), pages, config)

    def step(self, context: list[tuple[str, list[int]]], generation: list[tuple[str, list[int]]] = (),
             speculative: bool = False) -> list[torch.Tensor]:
        """One forward over context rows then generation rows; returns each row's logits [n_i, V] on the CPU."""
        rows = [*context, *generation]
        step = self.mgr.prepare_step([r for r, _ in rows], [len(t) for _, t in rows])
        tokens = len(generation[0][1]) if generation else 1
        batch = forward_batch(self.mgr, step, len(context), tokens, speculative)
        ids = torch.tensor([tok for _, t in rows for tok in t], dtype=torch.long, device=self.device)
        logits = self.model.logits(self.model(ids, batch)).cpu()
        return list(logits.split([len(t) for _, t in rows]))

    def accept(self, num_valid: list[int] | None = None) -> None:
        self.mgr.accept(num_valid)
        self.mgr.check_integrity()

    def prefill(self, prompts: dict[str, list[int]]) -> list[torch.Tensor]:
        """New requests, prefilled together in one step and switched to generation."""
        for r in prompts:
            self.mgr.add_request(r)
        out = self.step(list(prompts.items()))
        self.accept()
        for r in prompts:
            self.mgr.start_generation(r)
        return out
