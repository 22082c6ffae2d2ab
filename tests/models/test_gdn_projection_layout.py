"""GDN's projections in the kernel layout: `GatedDeltaNetMixer.finish_load` (called by the loader) permutes the
rows of in_proj_qkvz / in_proj_ba once, so that qkv, z, b and a are column slices of the two outputs. Against
the checkpoint's per-key-head grouping (`CheckpointLayoutMixer`, the mixer as it was before) every output is
the same bit for bit: the projections, and the mixer outputs of prefill, decode, verify and mixed steps."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hybridcache.models.qwen3_next as qwen3_next
from hybridcache.models import load_model
from hybridcache.models.layers.gdn_mixer import GatedDeltaNetMixer, regroup_rows
from hybridcache.models.layers.params import checkpoint_targets

from .helpers import Driver
from .test_qwen3_next import random_ids, save_tiny


class CheckpointLayoutMixer(GatedDeltaNetMixer):
    """The mixer as it was before the kernel layout: rows as the checkpoint groups them (per key head q, k, v,
    z and b, a), split per key head and copied into place."""

    def finish_load(self) -> None:
        """Keep the checkpoint's row order."""

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        n, H, K, rV = x.shape[0], self.H, self.K, self.r * self.V
        w = self.checkpoint_tensors()
        q, k, v, z = F.linear(x, w["in_proj_qkvz.weight"]).view(n, H, 2 * K + 2 * rV).split([K, K, rV, rV], dim=-1)
        b, a = F.linear(x, w["in_proj_ba.weight"]).view(n, H, 2 * self.r).split([self.r, self.r], dim=-1)
        qkv = torch.cat([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], dim=-1)
        return qkv, z.reshape(n, self.HV, self.V), b.reshape(n, self.HV), a.reshape(n, self.HV)


def test_regroup_rows_takes_each_part_of_every_group_in_turn():
    rows = torch.arange(6.0)[:, None]  # 2 groups of parts [1, 2]: rows (0 | 1 2) (3 | 4 5)
    assert regroup_rows(rows, 2, [1, 2])[:, 0].tolist() == [0, 3, 1, 2, 4, 5]


def loaded_pair(dtype: torch.dtype, H: int = 2, HV: int = 6, K: int = 8, V: int = 4, D: int = 32,
                seed: int = 0) -> tuple[GatedDeltaNetMixer, CheckpointLayoutMixer, dict[str, torch.Tensor]]:
    """The mixer and its checkpoint-layout twin, filled name for name (as the loader does) from one random
    state dict, then finished; returns both and the state dict."""
    gen = torch.Generator().manual_seed(seed)
    ours, ref = (cls(0, D, H, HV, K, V, 4, 1e-6, "cpu", dtype) for cls in (GatedDeltaNetMixer, CheckpointLayoutMixer))
    state = {name: torch.randn(t.shape, generator=gen).to(dtype) for name, t in checkpoint_targets(ours).items()}
    for mixer in (ours, ref):
        targets = checkpoint_targets(mixer)
        assert targets.keys() == state.keys()  # the checkpoint's names and shapes
        with torch.no_grad():
            for name, t in targets.items():
                t.copy_(state[name])
        mixer.finish_load()
    return ours, ref, state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_projections_are_views_equal_to_the_checkpoint_grouping(dtype):
    ours, ref, state = loaded_pair(dtype)
    x = torch.randn(7, 32).to(dtype)
    got, want = ours._project(x), ref._project(x)
    for name, g, w in zip(("qkv", "z", "b", "a"), got, want):
        assert g.shape == w.shape and torch.equal(g, w), name
    qkv, z, b, a = got
    assert qkv._base is not None and all(t._base is qkv._base for t in (z, b, a))  # views of one GEMM's output
    assert qkv.stride() == b.stride() == (qkv._base.shape[1], 1)
    loaded = checkpoint_targets(ours)
    assert torch.equal(loaded["in_proj_qkvz.weight"], regroup_rows(state["in_proj_qkvz.weight"], 2, [8, 8, 12, 12]))
    assert torch.equal(loaded["in_proj_ba.weight"], regroup_rows(state["in_proj_ba.weight"], 2, [3, 3]))
    assert torch.equal(ours.in_weight, torch.cat([loaded["in_proj_qkvz.weight"], loaded["in_proj_ba.weight"]]))
    assert ours.kernel_layout and not ref.kernel_layout
    with pytest.raises(RuntimeError, match="already in the kernel layout"):
        ours.finish_load()


def gdn_mixers(model) -> list[GatedDeltaNetMixer]:
    return [m for m in model.modules() if isinstance(m, GatedDeltaNetMixer)]


# "W": 4 key heads of 8 value heads (HV = 32, HV·V = 256); "A": 2 key heads of 4 (test_qwen3_next's config A)
CONFIGS = {"W": dict(linear_num_key_heads=4, linear_num_value_heads=32), "A": {}}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def models(request, tmp_path_factory):
    """(config name, ours, the checkpoint-layout twin) loaded from one tiny Qwen3-Next checkpoint."""
    path, _ = save_tiny(tmp_path_factory.mktemp(f"gdn_layout_{request.param}"), "A", **CONFIGS[request.param])
    ours = load_model(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(qwen3_next, "GatedDeltaNetMixer", CheckpointLayoutMixer)
        ref = load_model(path)
    assert gdn_mixers(ours) and all(m.kernel_layout for m in gdn_mixers(ours))
    assert all(type(m) is CheckpointLayoutMixer for m in gdn_mixers(ref))
    return request.param, ours, ref


def run_steps(model, speculative: bool) -> list[torch.Tensor]:
    """Prefill two prompts, then a mixed step (a new prompt's context row with the generation rows), then
    generation steps (plain decode, or verify steps of T = 4 with random acceptance); returns every GDN mixer
    output and every step's logits."""
    outs: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: outs.append(o.clone())) for m in gdn_mixers(model)]
    try:
        logits = steps(model, speculative)
    finally:
        for h in hooks:
            h.remove()
    return outs + logits


def steps(model, speculative: bool) -> list[torch.Tensor]:
    T = 4 if speculative else 1
    g = torch.Generator().manual_seed(1)
    drv = Driver(model, num_draft_tokens=T - 1)
    drv.prefill({"a": random_ids(9, 2).tolist(), "b": random_ids(70, 3).tolist()})
    drv.mgr.add_request("c")
    gen = lambda: [(r, torch.randint(0, 96, (T,), generator=g).tolist()) for r in ("a", "b")]  # noqa: E731
    logits = drv.step([("c", random_ids(6, 4).tolist())], gen(), speculative)
    drv.accept([6, T, T])
    drv.mgr.start_generation("c")
    for _ in range(4):
        rows = gen() + [("c", torch.randint(0, 96, (T,), generator=g).tolist())]
        logits += drv.step([], rows, speculative)
        drv.accept([int(torch.randint(1, T + 1, (1,), generator=g)) for _ in rows] if speculative else None)
    return logits


@pytest.mark.parametrize("speculative", [False, True], ids=["decode", "verify"])
def test_mixer_outputs_equal_the_checkpoint_grouping(models, speculative):
    """Bit for bit where torch's CPU kernels treat both layouts alike. They do not always: an elementwise op
    over a strided view runs its inner loop row by row, and a row shorter than two SIMD vectors (sigmoid(b) of
    config A, HV = 4: the old b was a contiguous copy) runs the scalar code, whose exp differs from the vector
    code by an ulp. At HV = 32 and HV·V = 256 every row fills whole vectors in both layouts (on CUDA the
    elementwise kernels do not depend on the layout at all)."""
    name, ours, ref = models
    got, want = run_steps(ours, speculative), run_steps(ref, speculative)
    assert len(got) == len(want) > 0
    for i, (g, w) in enumerate(zip(got, want)):
        if name == "W":
            assert torch.equal(g, w), f"output {i}: max diff {(g - w).abs().max()}"
        else:
            scale = float(w.abs().max())  # a few ulps of sigmoid(b) become ~3e-7 of the outputs' scale
            torch.testing.assert_close(g, w, rtol=0, atol=1e-5 * scale, msg=lambda m: f"output {i}: {m}")
