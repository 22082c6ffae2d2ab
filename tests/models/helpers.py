"""Tiny checkpoints built with transformers (any family; NemotronH by default), their reference logits, and
a manager-driven runner for any family."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from hybridcache.cache import CacheConfig, HybridCacheManager
from hybridcache.engine.forward_batch import forward_batch
from hybridcache.states import KVPages

TINY = dict(
    vocab_size=96, hidden_size=32, hybrid_override_pattern="M*-E", num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, intermediate_size=48, mamba_num_heads=4, mamba_head_dim=8, n_groups=2, ssm_state_size=8,
    conv_kernel=4, chunk_size=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
    moe_shared_expert_intermediate_size=24,
)


def save_hf_tiny(path: Path, config_cls: type, model_cls: type, config: dict[str, Any], seed: int = 0,
                 noise: float = 0.1, noise_buffers: bool = True,
                 tweak: Callable[[torch.nn.Module], None] | None = None) -> tuple[Path, torch.nn.Module]:
    """Save a seeded `model_cls(config_cls(**config))` to `path`; returns (path, the model in eval mode).

    Vector parameters (and, with `noise_buffers`, buffers) get `noise * randn` so that ones / zeros
    initialisations cannot hide a missing term; `tweak` then edits weights in place (e.g. sharpens routers);
    the LM head is scaled by 8 so that greedy choices are not near-ties.
    """
    torch.manual_seed(seed)
    model = model_cls(config_cls(**config)).eval()
    with torch.no_grad():
        for t in [*model.parameters(), *(model.buffers() if noise_buffers else ())]:
            if t.ndim == 1 and t.is_floating_point():
                t.add_(noise * torch.randn_like(t))
        if tweak is not None:
            tweak(model)
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    return path, model


def save_tiny(path: Path, seed: int = 0, **overrides: Any) -> tuple[Path, torch.nn.Module]:
    """Save a seeded tiny NemotronH (`TINY` + overrides) to `path`; returns (path, the transformers model)."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    return save_hf_tiny(path, NemotronHConfig, NemotronHForCausalLM, {**TINY, **overrides}, seed)


def reference_logits(hf_model: torch.nn.Module, ids: list[int] | torch.Tensor) -> torch.Tensor:
    """transformers' full-sequence forward. ids: [L] -> [L, V] fp32."""
    with torch.no_grad():
        return hf_model(torch.as_tensor(ids)[None], use_cache=False).logits[0].float()


def close(got: torch.Tensor, want: torch.Tensor, msg: str = "") -> None:
    """Logits agree to 1e-4 absolute."""
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0, msg=lambda m: f"{msg}\n{m}")


class Driver:
    """Runs steps of any family's model through a HybridCacheManager the way the engine does."""

    def __init__(self, model: Any, num_draft_tokens: int = 0, num_slots: int = 4, page_size: int = 4,
                 device: str = "cpu") -> None:
        self.model, self.page_size, self.device = model, page_size, device
        self.num_draft_tokens = num_draft_tokens
        config = CacheConfig(device_bytes=1 << 22, host_bytes=1 << 22, num_slots=num_slots, page_size=page_size,
                             device=device)
        pages = model.page_roles(page_size)
        if pages is None:
            # the manager still counts pages for requests when it has no page roles (it then has 0 pages and
            # refuses every step); a 1-element page role the model never reads works around it
            pages = KVPages(1, 1, 1, page_size, torch.float32)
        self.mgr = HybridCacheManager(model.state_modules(num_draft_tokens), pages, config)

    def step(self, context: list[tuple[str, list[int]]], generation: list[tuple[str, list[int]]] = (),
             speculative: bool | None = None) -> list[torch.Tensor]:
        """One forward over context rows then generation rows; returns each row's logits [n_i, V] on the CPU.
        `speculative` defaults to whether the roles were built with draft tokens."""
        if speculative is None:
            speculative = self.num_draft_tokens > 0
        rows = [*context, *generation]
        step = self.mgr.prepare_step([r for r, _ in rows], [len(t) for _, t in rows])
        tokens = len(generation[0][1]) if generation else 1
        batch = forward_batch(self.mgr.store, step, len(context), tokens, speculative)
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
