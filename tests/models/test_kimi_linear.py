"""Kimi Linear (KDA + MLA + MoE) against transformers: prefill, plain decode, pending-draft verify, mixed
batches, bad checkpoints, and the LLM facade end to end (plain, speculative, under memory pressure)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import hybridcache.models.kimi_linear  # noqa: F401  (registers "kimi_linear")
from hybridcache.engine.forward_batch import forward_batch
from hybridcache.models import ModelLoadError, TensorShapeError, UnsupportedConfigError, load_model

from .helpers import Driver, close, reference_logits, save_hf_tiny

VOCAB = 96
TINY = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=24, q_lora_rank=None, qk_rope_head_dim=8,
    qk_nope_head_dim=8, v_head_dim=8, num_local_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
    linear_attn_config={"kda_layers": [1, 3], "full_attn_layers": [2, 4], "head_dim": 8, "num_heads": 2,
                        "short_conv_kernel_size": 4},
    first_k_dense_replace=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
CONFIGS = {
    "KAKA, dense first, conv 4": {},
    "AKKAK, q lora, biases, grouped router, 2 shared, conv 3": dict(
        num_hidden_layers=5, q_lora_rank=12, attention_bias=True, num_local_experts=8, n_group=2, topk_group=1,
        num_experts_per_tok=3, n_shared_experts=2, routed_scaling_factor=2.5, first_k_dense_replace=0,
        linear_attn_config={"kda_layers": [2, 3, 5], "full_attn_layers": [1, 4], "head_dim": 4, "num_heads": 4,
                            "short_conv_kernel_size": 3},
    ),
    "KAKA, biases without q lora": dict(attention_bias=True),  # kv_a_proj's bias beside q_proj's none
}


# ---------------------------------------------------------------------------------------------- helpers
def save_tiny(path: Path, seed: int = 0, **overrides) -> tuple[Path, torch.nn.Module]:
    """Save a seeded tiny KimiLinear (`TINY` + overrides); returns (path, the transformers model)."""
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    return save_hf_tiny(path, KimiLinearConfig, KimiLinearForCausalLM, {**TINY, **overrides}, seed)


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    return save_tiny(tmp_path_factory.mktemp("kimi"))


# ---------------------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_prefill_matches_transformers(tmp_path, overrides):
    path, hf = save_tiny(tmp_path, **overrides)
    model = load_model(path)
    prompts = {"a": tokens(70, 1), "b": tokens(6, 2), "c": tokens(1, 3)}  # 70 > one 64-token KDA chunk
    for (r, p), got in zip(prompts.items(), Driver(model).prefill(prompts)):
        close(got, reference_logits(hf, p), f"request {r}")


def test_chunked_prefill_then_decode_matches_full_forward(tiny):
    path, hf = tiny
    drv = Driver(load_model(path))
    seqs = {"a": tokens(30, 4), "b": tokens(25, 5)}
    ref = {r: reference_logits(hf, s) for r, s in seqs.items()}
    for r in seqs:
        drv.mgr.add_request(r)
    # prompts of 9 and 6 tokens, in two context chunks each
    for (a0, a1), (b0, b1) in (((0, 5), (0, 2)), ((5, 9), (2, 6))):
        la, lb = drv.step([("a", seqs["a"][a0:a1]), ("b", seqs["b"][b0:b1])])
        drv.accept()
        close(la, ref["a"][a0:a1], "chunk a")
        close(lb, ref["b"][b0:b1], "chunk b")
    for r in seqs:
        drv.mgr.start_generation(r)
    pos = {"a": 9, "b": 6}
    for _ in range(15):
        la, lb = drv.step([], [(r, [seqs[r][pos[r]]]) for r in seqs])
        drv.accept([1, 1])
        close(la, ref["a"][pos["a"]][None], f"decode a at {pos['a']}")
        close(lb, ref["b"][pos["b"]][None], f"decode b at {pos['b']}")
        pos = {r: p + 1 for r, p in pos.items()}


def test_speculative_verify_matches_full_forward(tiny):
    """T = 4 per step; `v` random in [1, 4]: the first v fed tokens follow the reference sequence, the rest
    are wrong drafts. Valid-token logits equal the full forward's."""
    path, hf = tiny
    k = 3
    drv = Driver(load_model(path), num_draft_tokens=k)
    seqs = {"a": tokens(90, 6), "b": tokens(80, 7)}
    ref = {r: reference_logits(hf, s) for r, s in seqs.items()}
    pos = {"a": 7, "b": 3}
    drv.prefill({r: seqs[r][: pos[r]] for r in seqs})
    gen = torch.Generator().manual_seed(8)
    accepted = []
    for step in range(24):
        valid = {r: int(torch.randint(1, k + 2, (1,), generator=gen)) for r in seqs}
        fed = {}
        for r, s in seqs.items():
            good = s[pos[r] : pos[r] + valid[r]]
            wrong = [(t + 1 + step) % VOCAB for t in s[pos[r] + valid[r] : pos[r] + k + 1]]
            fed[r] = good + wrong
        outs = drv.step([], list(fed.items()))
        for (r, v), got in zip(valid.items(), outs):
            close(got[:v], ref[r][pos[r] : pos[r] + v], f"step {step} request {r} ({v} valid)")
        drv.accept(list(valid.values()))
        pos = {r: p + valid[r] for r, p in pos.items()}
        accepted += valid.values()
    assert {1, k + 1} <= set(accepted)  # both extremes of acceptance were exercised


@pytest.mark.parametrize("num_draft_tokens", [0, 3])
def test_mixed_batch_equals_separate_runs(tiny, num_draft_tokens):
    """Generation rows of a and b share a step with the prefill of c; each equals running it alone."""
    path, _ = tiny
    model = load_model(path)
    T = num_draft_tokens + 1
    prompts = {"a": tokens(11, 9), "b": tokens(5, 10)}
    feeds = {r: [tokens(T, 20 + 2 * s + i) for s in range(4)] for i, r in enumerate(prompts)}
    late = tokens(13, 11)

    mixed = Driver(model, num_draft_tokens)
    mixed.prefill(prompts)
    mixed.mgr.add_request("c")
    together = {r: [] for r in [*prompts, "c"]}
    for s in range(4):
        context = [("c", late)] if s == 1 else []
        outs = mixed.step(context, [(r, feeds[r][s]) for r in prompts])
        for (r, _), o in zip([*context, *[(r, None) for r in prompts]], outs):
            together[r].append(o)
        mixed.accept([T] * len(outs))
        if s == 1:
            mixed.mgr.start_generation("c")

    for r, p in prompts.items():
        alone = Driver(model, num_draft_tokens)
        alone.prefill({r: p})
        for s in range(4):
            (o,) = alone.step([], [(r, feeds[r][s])])
            alone.accept([T])
            torch.testing.assert_close(together[r][s], o, atol=1e-5, rtol=0)
    (c_alone,) = Driver(model, num_draft_tokens).prefill({"c": late})
    torch.testing.assert_close(together["c"][0], c_alone, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------- bad input
def _edit_config(path: Path, **changes) -> None:
    file = path / "config.json"
    config = json.loads(file.read_text())
    config.update(changes)
    file.write_text(json.dumps(config))


def test_unequal_kda_qkv_widths_are_refused(tmp_path):
    path, _ = save_tiny(tmp_path)
    tensors = load_file(path / "model.safetensors")
    for name in ("k_proj.weight", "k_conv1d.weight"):
        full = f"model.layers.0.self_attn.{name}"
        tensors[full] = tensors[full][: tensors[full].shape[0] // 2].contiguous()  # k narrower than q and v
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(TensorShapeError, match=r"model\.layers\.0\.self_attn\.k_(proj|conv1d)\.weight"):
        load_model(path)


def test_unequal_kda_widths_in_config_are_refused(tmp_path):
    path, _ = save_tiny(tmp_path)
    _edit_config(path, linear_attn_config={**TINY["linear_attn_config"], "expand_v": 2})
    with pytest.raises(UnsupportedConfigError, match="q/k/v widths must be equal") as err:
        load_model(path)
    assert err.value.field == "linear_attn_config.expand_v"


@pytest.mark.parametrize("change, field", [
    (dict(sliding_window=64), "sliding_window"),
    (dict(mla_use_nope=False), "mla_use_nope"),
    (dict(linear_attn_config={**TINY["linear_attn_config"], "gate_lower_bound": -5.0}), "linear_attn_config"),
    (dict(layer_types=["linear_attention", "full_attention", "full_attention", "linear_attention"]), "layer_types"),
    (dict(num_key_value_heads=2), "num_key_value_heads"),
])
def test_config_fields_the_loader_cannot_serve_are_refused(tmp_path, change, field):
    path, _ = save_tiny(tmp_path)
    _edit_config(path, **change)
    with pytest.raises(UnsupportedConfigError) as err:
        load_model(path)
    assert err.value.field == field and isinstance(err.value, ModelLoadError)
    assert field in str(err.value)


def test_plain_decode_over_pending_draft_roles_is_refused(tiny):
    """With pending-draft roles a plain decode would skip accepted drafts still pending: refused."""
    drv = Driver(load_model(tiny[0]), num_draft_tokens=3)
    drv.prefill({"a": tokens(5, 13)})
    step = drv.mgr.prepare_step(["a"], [1])
    batch = forward_batch(drv.mgr.store, step, 0, 1, speculative=False)
    with pytest.raises(ValueError, match="speculative=True"):
        drv.model(torch.tensor([7]), batch)


def test_original_checkpoint_spelling_loads(tmp_path, tiny):
    """The original config.json has no `layer_types` / `mlp_layer_types` / `linear_*` fields: the 1-indexed
    `linear_attn_config` and `first_k_dense_replace` alone give the same model; `mlp.` names are accepted."""
    path, hf = tiny
    config = json.loads((path / "config.json").read_text())
    for key in ("layer_types", "mlp_layer_types", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim"):
        config.pop(key)
    dense = ("gate_proj", "up_proj", "down_proj")  # the dense MLP of layer 0, as the original names it
    tensors = {}
    for name, t in load_file(path / "model.safetensors").items():
        for proj in dense:
            name = name.replace(f".block_sparse_moe.{proj}.", f".mlp.{proj}.")
        tensors[name] = t
    assert "model.layers.0.mlp.gate_proj.weight" in tensors
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    prompt = tokens(12, 12)
    (got,) = Driver(load_model(tmp_path)).prefill({"a": prompt})
    close(got, reference_logits(hf, prompt))


# ---------------------------------------------------------------------------------------------- end to end
PROMPTS = [tokens(n, 30 + i) for i, n in enumerate((9, 14, 5, 11, 7, 16))]
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def hf_greedy(tiny) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (batch 1, no padding)."""
    _, hf = tiny
    outs = []
    with torch.no_grad():
        for p in PROMPTS:
            seq = hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                              do_sample=False, pad_token_id=0)
            outs.append(seq[0, len(p):].tolist())
    return outs


def _run(llm) -> list[list[int]]:
    from hybridcache import SamplingParams

    llm.step_hook = llm.manager.check_integrity
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "ngram k=3"])
def test_llm_greedy_equals_transformers_generate(tiny, hf_greedy, speculative):
    from hybridcache import LLM, SpeculativeConfig

    spec = SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3) if speculative else None
    llm = LLM(tiny[0], max_num_seqs=8, device_cache_bytes=1 << 22, page_size=4, speculative=spec,
              max_model_len=64)
    assert _run(llm) == hf_greedy
    if speculative:
        assert llm.stats.num_draft_tokens > 0


def test_llm_under_memory_pressure_equals_transformers_generate(tiny, hf_greedy):
    from hybridcache import LLM, SpeculativeConfig

    spec = SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3)
    sizing = LLM(tiny[0], max_num_seqs=4, device_cache_bytes=1 << 22, page_size=4, speculative=spec,
                 max_model_len=64).manager.sizing
    # 4 slots (the facade gives slots at most half the budget) and pages for ~2.5 of the 10-page requests
    budget = 4 * sizing.bytes_per_slot + 24 * sizing.bytes_per_page
    assert budget // 2 // sizing.bytes_per_slot >= 4
    llm = LLM(tiny[0], max_num_seqs=4, device_cache_bytes=budget, host_cache_bytes=1 << 22, page_size=4,
              speculative=spec, max_model_len=64)
    assert _run(llm) == hf_greedy
    assert llm.stats.num_suspensions > 0 and llm.stats.num_resumes > 0
    assert not llm.manager.requests()  # everything freed
