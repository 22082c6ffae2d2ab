"""KDA's fused projections: `KDAMixer.in_weight` `[3*H*K + 2*K + H, D]`, whose row slices are the
checkpoint's q_proj / k_proj / v_proj / f_a_proj / g_a_proj / b_proj weights, gives all six in one linear;
`up_weight` `[2*H*K, 2*K]`, whose diagonal blocks are f_b_proj and g_b_proj (zeros elsewhere), gives both
up-projections in another (views, filled name for name by the loader). Against the checkpoint layout
(`CheckpointLayoutMixer`, the mixer as it was: eight linears, q, k and v concatenated) the mixer outputs
and logits of prefill, decode, verify and mixed steps agree to fp32 rounding, rtol = atol = 1e-5: the one
wide GEMM blocks its dot products otherwise than six narrow ones (1.4e-6 at most seen, on logits up to
4.8). On CPU, where g and beta are computed for every row in both; the fused gate of the CUDA kernels is
tested against the precomputed one in tests/ops."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hybridcache.models.kimi_linear as kimi_linear
from hybridcache.models import load_model
from hybridcache.models.layers.kda_mixer import KDAMixer
from hybridcache.models.layers.params import checkpoint_targets

from .helpers import Driver
from .test_kimi_linear import save_tiny, tokens


class CheckpointLayoutMixer(KDAMixer):
    """The mixer as it was before the fused projection: one linear a checkpoint weight, q, k, v concatenated."""

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        t = self.checkpoint_tensors()

        def linear(name: str) -> torch.Tensor:
            return F.linear(x, t[f"{name}.weight"].clone())

        def up(name: str, low_rank: torch.Tensor) -> torch.Tensor:
            return F.linear(low_rank, t[f"{name}.weight"].clone()).view(x.shape[0], self.num_heads, self.head_dim)

        qkv = torch.cat([linear(f"{p}_proj") for p in "qkv"], dim=-1)
        return qkv, up("f_b_proj", linear("f_a_proj")), linear("b_proj"), up("g_b_proj", linear("g_a_proj"))


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "f_a_proj", "g_a_proj", "b_proj")
UP = ("f_b_proj", "g_b_proj")


def test_checkpoint_names_are_row_views_of_the_fused_weight():
    """Loading name for name fills the fused weights: the six projections of x are row slices of one, the two
    up-projections the diagonal blocks of the other (zeros elsewhere); the module's parameter walk lists each
    weight once (no q_proj / f_a_proj / f_b_proj ... modules)."""
    D, H, K = 32, 2, 8
    mixer = KDAMixer(0, D, H, K, 4, 1e-6, "cpu", torch.float32)
    targets = checkpoint_targets(mixer)
    gen = torch.Generator().manual_seed(0)
    rows = dict(q_proj=H * K, k_proj=H * K, v_proj=H * K, f_a_proj=K, g_a_proj=K, b_proj=H)
    w = {p: torch.randn(rows[p], D, generator=gen) for p in PROJECTIONS}
    w.update({p: torch.randn(H * K, K, generator=gen) for p in UP})
    with torch.no_grad():
        for p in PROJECTIONS + UP:
            assert targets[f"{p}.weight"].shape == w[p].shape
            targets[f"{p}.weight"].copy_(w[p])
    assert torch.equal(mixer.in_weight, torch.cat([w[p] for p in PROJECTIONS]))
    assert torch.equal(mixer.up_weight, torch.block_diag(w["f_b_proj"], w["g_b_proj"]))
    assert "in_weight" not in targets and "up_weight" not in targets
    assert not any(n.split(".")[0] in PROJECTIONS + UP for n, _ in mixer.named_parameters())
    x = torch.randn(5, D, generator=gen)
    qkv, g_raw, b, gate = mixer._project(x)
    assert qkv.shape == (5, 3 * H * K) and g_raw.shape == gate.shape == (5, H, K) and b.shape == (5, H)
    torch.testing.assert_close(qkv, torch.cat([x @ w[p].T for p in PROJECTIONS[:3]], dim=-1))
    torch.testing.assert_close(b, x @ w["b_proj"].T)
    torch.testing.assert_close(g_raw, (x @ w["f_a_proj"].T @ w["f_b_proj"].T).view(5, H, K))
    torch.testing.assert_close(gate, (x @ w["g_a_proj"].T @ w["g_b_proj"].T).view(5, H, K))


def kda_mixers(model) -> list[KDAMixer]:
    return [m for m in model.modules() if isinstance(m, KDAMixer)]


# "A": test_kimi_linear's tiny (H = 2, K = 8, D = 32); "W": H = 4, K = 32, D = 64 (H*K = 128)
CONFIGS = {"A": {}, "W": dict(hidden_size=64, linear_attn_config={"kda_layers": [1, 3], "full_attn_layers": [2, 4],
                                                                   "head_dim": 32, "num_heads": 4,
                                                                   "short_conv_kernel_size": 4})}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def models(request, tmp_path_factory):
    """(config name, ours, the checkpoint-layout twin) loaded from one tiny Kimi-Linear checkpoint."""
    path, _ = save_tiny(tmp_path_factory.mktemp(f"kda_layout_{request.param}"), **CONFIGS[request.param])
    ours = load_model(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kimi_linear, "KDAMixer", CheckpointLayoutMixer)
        ref = load_model(path)
    assert kda_mixers(ours) and all(type(m) is KDAMixer for m in kda_mixers(ours))
    assert all(type(m) is CheckpointLayoutMixer for m in kda_mixers(ref))
    return request.param, ours, ref


def run_steps(model, speculative: bool) -> list[torch.Tensor]:
    """Prefill two prompts, then a mixed step (a new prompt's context row with the generation rows), then
    generation steps (plain decode, or verify steps of T = 4 with random acceptance); returns every KDA mixer
    output and every step's logits."""
    outs: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: outs.append(o.clone())) for m in kda_mixers(model)]
    try:
        T = 4 if speculative else 1
        g = torch.Generator().manual_seed(1)
        drv = Driver(model, num_draft_tokens=T - 1)
        logits = drv.prefill({"a": tokens(9, 2), "b": tokens(70, 3)})
        drv.mgr.add_request("c")
        gen = lambda: [(r, torch.randint(3, 96, (T,), generator=g).tolist()) for r in ("a", "b")]  # noqa: E731
        logits += drv.step([("c", tokens(6, 4))], gen(), speculative)
        drv.accept([6, T, T])
        drv.mgr.start_generation("c")
        for _ in range(4):
            rows = gen() + [("c", torch.randint(3, 96, (T,), generator=g).tolist())]
            logits += drv.step([], rows, speculative)
            drv.accept([int(torch.randint(1, T + 1, (1,), generator=g)) for _ in rows] if speculative else None)
    finally:
        for h in hooks:
            h.remove()
    return outs + list(logits)


@pytest.mark.parametrize("speculative", [False, True], ids=["decode", "verify"])
def test_mixer_outputs_equal_the_checkpoint_layout(models, speculative):
    name, ours, ref = models
    got, want = run_steps(ours, speculative), run_steps(ref, speculative)
    assert len(got) == len(want) > 0
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} output {i}: {m}")
