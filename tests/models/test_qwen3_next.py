"""Qwen3-Next (Gated DeltaNet + gated attention, MoE with a shared expert) against transformers, fp32.

Prefill, plain decode, speculative verify with random acceptance and mixed context/generation batches are
driven through the HybridCacheManager; the LLM facade's greedy outputs equal transformers' `generate`.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import hybridcache.models.qwen3_next  # noqa: F401  (registers "qwen3_next")
from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.models import UnsupportedConfigError, load_model
from hybridcache.models.layers.shared_moe import SharedExpertMoE

from .helpers import Driver, close, reference_logits, save_hf_tiny

VOCAB = 96
GDN, ATTN = "linear_attention", "full_attention"
# A: 2 key heads / 4 value heads, conv 3, MoE with a shared expert everywhere.
# B: 1 key head / 3 value heads, conv 4, half the rotary width, dense MLP on layers 0 and 2.
CONFIGS = {
    "A": dict(layer_types=[GDN, ATTN, GDN, ATTN], linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=3),
    "B": dict(layer_types=[GDN, GDN, ATTN, GDN], linear_num_key_heads=1, linear_num_value_heads=3,
              linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
              rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
              decoder_sparse_step=2),
}
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=24)


def save_tiny(path: Path, name: str = "A", seed: int = 0, **overrides) -> tuple[Path, torch.nn.Module]:
    """Save a seeded tiny Qwen3-Next (`TINY` + `CONFIGS[name]` + overrides); returns (path, the transformers
    model). Vector parameters get more noise (0.2, buffers keep theirs: the rotary table), and routers are
    sharpened (no near-ties in top-k)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    return save_hf_tiny(path, Qwen3NextConfig, Qwen3NextForCausalLM, {**TINY, **CONFIGS[name], **overrides}, seed,
                        noise=0.2, noise_buffers=False, tweak=sharpen_routers)


def sharpen_routers(model: torch.nn.Module) -> None:
    for name, t in model.named_parameters():
        if name.endswith("mlp.gate.weight"):
            t.mul_(20.0)


def random_ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request, tmp_path_factory) -> tuple[str, torch.nn.Module, torch.nn.Module]:
    """(config name, our model, transformers' model) for each config."""
    path, hf = save_tiny(tmp_path_factory.mktemp(f"qwen3_next_{request.param}"), request.param)
    return request.param, load_model(path), hf


def test_layer_layout_and_cache_roles_follow_the_checkpoint(tiny):
    name, model, hf = tiny
    kinds = CONFIGS[name]["layer_types"]
    assert [layer.kind for layer in model.model.layers] == kinds
    (state,) = model.state_modules(3)
    assert (state.num_layers, state.H, state.HV, state.conv_kernel) == (
        kinds.count(GDN), hf.config.linear_num_key_heads, hf.config.linear_num_value_heads,
        hf.config.linear_conv_kernel_dim)
    assert model.page_roles(4).num_layers == kinds.count(ATTN)
    sparse = [isinstance(layer.mlp, SharedExpertMoE) for layer in model.model.layers]
    assert sparse == [type(layer.mlp).__name__ == "Qwen3NextSparseMoeBlock" for layer in hf.model.layers]
    assert any(sparse)


def test_prefill_logits_match_transformers(tiny):
    """Two prompts in one varlen prefill step (one longer than a GDN chunk of 64)."""
    _, model, hf = tiny
    prompts = {"a": random_ids(70, 1), "b": random_ids(5, 2)}
    drv = Driver(model)
    for r in prompts:
        drv.mgr.add_request(r)
    got = drv.step([(r, p.tolist()) for r, p in prompts.items()])
    for (r, p), logits in zip(prompts.items(), got):
        close(logits, reference_logits(hf, p), f"request {r}")


def test_chunked_prefill_then_plain_decode_matches_full_forward(tiny):
    """Prompt in two chunks (the second from the pool's state), then one token per step, two requests."""
    _, model, hf = tiny
    seqs = {"a": random_ids(30, 3), "b": random_ids(26, 4)}
    refs = {r: reference_logits(hf, s) for r, s in seqs.items()}
    drv = Driver(model)
    for r in seqs:
        drv.mgr.add_request(r)
    for lo, hi in ((0, 5), (5, 11)):
        got = drv.step([(r, s[lo:hi].tolist()) for r, s in seqs.items()])
        drv.accept()
        for (r, _), logits in zip(seqs.items(), got):
            close(logits, refs[r][lo:hi], f"prefill chunk {lo}:{hi}, request {r}")
    for r in seqs:
        drv.mgr.start_generation(r)
    for pos in range(11, 26):
        got = drv.step([], [(r, [int(s[pos])]) for r, s in seqs.items()])
        drv.accept()
        for (r, _), logits in zip(seqs.items(), got):
            close(logits, refs[r][pos : pos + 1], f"decode position {pos}, request {r}")


def test_speculative_verify_with_random_acceptance(tiny):
    """k = 3 (T = 4) over 24 steps: the step's valid tokens get the full forward's logits; rejected (wrong)
    drafts leave no trace; the replay history folds and flips buffers several times."""
    K, T, STEPS = 3, 4, 24
    _, model, hf = tiny
    g = torch.Generator().manual_seed(5)
    prompt = {"a": 7, "b": 12}
    seqs = {r: random_ids(n + STEPS * T + T, 10 + n) for r, n in prompt.items()}
    refs = {r: reference_logits(hf, s) for r, s in seqs.items()}
    drv = Driver(model, num_draft_tokens=K)
    drv.prefill({r: seqs[r][:n].tolist() for r, n in prompt.items()})
    pos, flips = dict(prompt), 0
    for step in range(STEPS):
        valid = {r: int(torch.randint(1, T + 1, (1,), generator=g)) for r in seqs}
        rows = []
        for r in seqs:
            tokens = seqs[r][pos[r] : pos[r] + T].clone()
            wrong = (tokens + 1 + torch.randint(0, VOCAB - 1, (T,), generator=g)) % VOCAB  # never the true token
            tokens[valid[r]:] = wrong[valid[r]:]
            rows.append((r, tokens.tolist()))
        buf_before = drv.mgr.state_tensors("gdn")["buf_idx"][0].clone()
        got = drv.step([], rows, speculative=True)
        for (r, _), logits in zip(rows, got):
            close(logits[: valid[r]], refs[r][pos[r] : pos[r] + valid[r]], f"step {step}, request {r}, v={valid[r]}")
        drv.accept([valid[r] for r in seqs])
        flips += int((drv.mgr.state_tensors("gdn")["buf_idx"][0] != buf_before).sum())
        for r in seqs:
            pos[r] += valid[r]
    assert flips >= 4


@pytest.mark.parametrize("speculative", [False, True])
def test_mixed_batch_equals_separate_steps(tiny, speculative):
    """One step with a context row and a generation row equals the two rows run in separate steps."""
    _, model, hf = tiny
    T = 4 if speculative else 1
    old, new = random_ids(20, 6), random_ids(9, 7)

    def setup() -> Driver:
        drv = Driver(model, num_draft_tokens=T - 1)
        drv.prefill({"old": old[:12].tolist()})
        drv.mgr.add_request("new")
        return drv

    mixed = setup()
    got_mixed = mixed.step([("new", new.tolist())], [("old", old[12 : 12 + T].tolist())], speculative)
    mixed.accept([len(new), T])
    apart = setup()
    got_new = apart.step([("new", new.tolist())])
    apart.accept()
    got_old = apart.step([], [("old", old[12 : 12 + T].tolist())], speculative)
    apart.accept([T])
    close(got_mixed[0], got_new[0], "context row")
    close(got_mixed[1], got_old[0], "generation row")
    close(got_mixed[1], reference_logits(hf, old)[12 : 12 + T], "generation row vs transformers")
    for name in ("conv", "ssm"):  # the pools agree afterwards, too
        for r in ("old", "new"):
            a = mixed.mgr.state_tensors("gdn")[name][:, mixed.mgr.entry(r).slot]
            b = apart.mgr.state_tensors("gdn")[name][:, apart.mgr.entry(r).slot]
            close(a, b, f"{name} of {r}")


def test_step_kinds_the_roles_cannot_serve_are_refused(tiny):
    _, model, _ = tiny
    plain, replay = Driver(model), Driver(model, num_draft_tokens=3)
    for drv in (plain, replay):
        drv.prefill({"a": random_ids(6, 8).tolist()})
    with pytest.raises(ValueError, match="replay roles"):
        plain.step([], [("a", [1, 2, 3, 4])], speculative=True)
    with pytest.raises(ValueError, match="speculative=True"):
        replay.step([], [("a", [1])], speculative=False)


@pytest.fixture(scope="module")
def checkpoint_a(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("qwen3_next_cfg"), "A")[0]


def rewrite_config(src: Path, dst: Path, edit) -> Path:
    """Copy a checkpoint directory with `edit(config_dict)` applied to its config.json."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_older_config_spelling_loads_the_same_model(checkpoint_a, tmp_path):
    """`full_attention_interval` instead of `layer_types`, RoPE fields at the top level (older config.json)."""
    def legacy(c: dict) -> None:
        del c["layer_types"]
        rope = c.pop("rope_parameters")
        c.update(full_attention_interval=2, rope_theta=rope["rope_theta"],
                 partial_rotary_factor=rope["partial_rotary_factor"])

    old = load_model(rewrite_config(checkpoint_a, tmp_path / "legacy", legacy))
    new = load_model(checkpoint_a)
    assert old.spec == new.spec


@pytest.mark.parametrize("field,value", [
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
    ("linear_num_value_heads", 3),  # not a multiple of 2 key heads
    ("hidden_act", "gelu"),
    ("layer_types", ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]),
])
def test_unsupported_config_is_refused(checkpoint_a, tmp_path, field, value):
    path = rewrite_config(checkpoint_a, tmp_path / "bad", lambda c: c.update({field: value}))
    with pytest.raises(UnsupportedConfigError, match=field):
        load_model(path)


# ------------------------------------------------------------------------------------ end to end
PROMPT_LENS = (5, 9, 3, 14, 7, 11)
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def e2e(tmp_path_factory) -> tuple[Path, list[list[int]], list[list[int]]]:
    """(checkpoint, prompts, transformers' greedy continuations)."""
    # wider attention heads: a page of K/V outweighs a slot, so a small device budget still holds 4 slots
    path, hf = save_tiny(tmp_path_factory.mktemp("qwen3_next_e2e"), "A", seed=1, head_dim=32)
    prompts = []
    for i, n in enumerate(PROMPT_LENS):  # a repeated motif, so n-gram drafts get accepted
        motif = random_ids(n, 40 + i).tolist()
        prompts.append((motif * 2)[: n + n // 2])
    want = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                              min_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=VOCAB - 1)
            want.append(out[0, len(p):].tolist())
    return path, prompts, want


def greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    llm.step_hook = llm.manager.check_integrity
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("speculative", [None, SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3)], ids=["plain", "ngram3"])
def test_llm_greedy_equals_transformers_generate(e2e, speculative):
    path, prompts, want = e2e
    llm = LLM(str(path), speculative=speculative, max_num_seqs=4, max_model_len=64)
    assert greedy(llm, prompts) == want
    if speculative is not None:
        assert llm.stats.num_accepted_tokens > 0


@pytest.mark.parametrize("speculative", [None, SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=3)], ids=["plain", "ngram3"])
def test_llm_greedy_under_memory_pressure(e2e, speculative):
    """Four sequences at a time, six prompts, and device pages for about two whole requests: requests are
    suspended to the host tier and resumed, and the outputs do not change."""
    path, prompts, want = e2e
    sizing = LLM(str(path), speculative=speculative, max_num_seqs=4, max_model_len=64).manager.sizing
    slot, page = sizing.bytes_per_slot, sizing.bytes_per_page
    longest = max(len(p) for p in prompts) + MAX_TOKENS + 4
    pages_per_request = -(-longest // 16)
    budget = max(2 * 4 * slot, 4 * slot + 2 * pages_per_request * page)  # the facade gives slots at most half
    llm = LLM(str(path), speculative=speculative, max_num_seqs=4, max_model_len=64,
              device_cache_bytes=budget, host_cache_bytes=8 * budget)
    assert llm.manager.num_slots == 4 and llm.manager.num_pages < 4 * pages_per_request
    assert greedy(llm, prompts) == want
    assert llm.stats.num_suspensions > 0 and llm.stats.num_resumes > 0
