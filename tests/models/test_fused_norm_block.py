"""A nemotron_h block with its residual add and norm folded into the mixer's first GEMM (FUSE_NORM,
`layers/prenorm.py`) against the same block with them apart: the stream bit for bit and the block's output
within fp32 summation order, one row, an MLP block (no batch state), with a delta and without. Then each
family's one-row decode logits with each fold on (FUSE_NORM, FUSE_ACT, FUSE_GATED_NORM) against it off. Runs the
Triton kernels in the interpreter (CPU) or on CUDA."""
from __future__ import annotations

import pytest
import torch

from hybridcache.models.layers.mlp import MLP
from hybridcache.models.layers.norm import RMSNorm
from hybridcache.models.nemotron_h import Block
from hybridcache.ops import linear
from hybridcache.ops.triton_support import HAS_TRITON, interpreting, kernels_on_cpu
from tests.ops.dispatch import record_calls

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not (HAS_TRITON and interpreting()),
                                reason="needs CUDA, or triton's CPU interpreter (TRITON_INTERPRET=1)")


def mlp_block(hidden: int = 48, inner: int = 80, seed: int = 0) -> Block:
    block = Block("-", MLP(hidden, inner, "relu2", False, DEVICE, torch.float32),
                  RMSNorm(hidden, 1e-5, DEVICE, torch.float32), reads_batch=False)
    g = torch.Generator().manual_seed(seed)
    for p in block.parameters():
        p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return block


@pytest.mark.parametrize("with_delta", [True, False])
def test_folded_norm_gives_the_separate_launches_values(monkeypatch, with_delta):
    from hybridcache.ops import gemv_triton

    block = mlp_block()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 48, generator=g).to(DEVICE)
    delta = torch.randn(1, 48, generator=g).to(DEVICE) if with_delta else None
    calls = record_calls(monkeypatch, gemv_triton, "add_rms_norm_gemv_triton")
    with kernels_on_cpu() if DEVICE == "cpu" else torch.no_grad():
        stream, out = block.residual(x, delta, None)
        assert calls == []
        monkeypatch.setattr(linear, "FUSE_NORM", True)
        fused_stream, fused_out = block.residual(x, delta, None)
        assert calls == ["add_rms_norm_gemv_triton"]
        block.residual(torch.cat([x, x]), None if delta is None else torch.cat([delta, delta]), None)
        assert calls == ["add_rms_norm_gemv_triton"]  # two rows: apart
    assert torch.equal(fused_stream, stream)
    torch.testing.assert_close(fused_out, out, atol=1e-5, rtol=1e-5)


# the folds, and the entry points each family's one-row decode reaches with it on (qwen3_next has no dense MLP)
FOLDS = {"norm": ("FUSE_NORM", ["add_rms_norm_gemv_triton", "add_rms_norm_softmax_topk_triton",
                                "add_rms_norm_group_topk_triton"]),
         "act": ("FUSE_ACT", ["gemv_triton"]),
         "gated_norm": ("FUSE_GATED_NORM", ["gated_norm_gemv_triton"])}


@pytest.mark.skipif(DEVICE != "cpu", reason="the tiny models' kernels on CPU tensors (interpreter)")
@pytest.mark.parametrize("fold", sorted(FOLDS))
@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_next", "kimi_linear"])
def test_one_row_decode_logits_with_a_fold(family, fold, tmp_path, monkeypatch):
    """Each family's tiny model decoding one request (one row a step) with a fold on gives the logits of the same
    steps with it off, within fp32 summation order; the fold ran every step. `norm`: every block's norm folded
    into its mixer's first GEMM, or its mixture's router; `act`: the MLP activation into the down projection;
    `gated_norm`: the mixers' gated norms into their output projection."""
    from hybridcache.models.loader import load_model
    from hybridcache.ops import gemv_triton
    from hybridcache.ops.moe import routers_triton
    from tests.models import helpers, test_kimi_linear, test_qwen3_next

    if fold == "act" and family == "qwen3_next":
        pytest.skip("qwen3_next's tiny model has no dense MLP")
    save = {"nemotron_h": helpers.save_tiny, "qwen3_next": test_qwen3_next.save_tiny,
            "kimi_linear": test_kimi_linear.save_tiny}[family]
    path, _ = save(tmp_path / family)
    model = load_model(path)
    flag, entries = FOLDS[fold]
    folded_calls: list[str] = []
    for module in (gemv_triton, routers_triton):
        for name in entries:
            if hasattr(module, name):
                real = getattr(module, name)

                def spy(*args, _real=real, _name=name, **kwargs):
                    if _name != "gemv_triton" or kwargs.get("act"):  # the gemv counts only with an activation
                        folded_calls.append(_name)
                    return _real(*args, **kwargs)

                monkeypatch.setattr(module, name, spy)

    def decode(on: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(linear, flag, on)
        drv = helpers.Driver(model)
        drv.prefill({"a": [3 + i % 7 for i in range(9)]})
        out = []
        with kernels_on_cpu():
            for token in (5, 9, 4):
                out += drv.step([], [("a", [token])])
                drv.accept()
        return out

    apart = decode(False)
    assert folded_calls == []
    folded = decode(True)
    assert len(folded_calls) >= 3  # a step each, at least
    for a, f in zip(apart, folded):
        torch.testing.assert_close(f, a, atol=1e-5, rtol=1e-5)
