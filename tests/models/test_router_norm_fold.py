"""A decoder layer's second residual add and RMSNorm run in its mixture's router launch (`ops/moe.FOLD_NORM`,
`DecoderLayer.residual`, the routers' `add_norm_route`) against the norm launched apart: each MoE family's tiny
model decoding two requests gives the logits of the same steps with the fold off, within fp32 summation order, and
the fold ran at every MoE layer of every step. The kernels run in Triton's interpreter on CPU tensors (the
kernels' own tests cover CUDA)."""
from __future__ import annotations

import pytest
import torch

from hybridcache.ops import moe
from hybridcache.ops.triton_support import HAS_TRITON, interpreting, kernels_on_cpu
from tests.ops.dispatch import record_calls

pytestmark = pytest.mark.skipif(not (HAS_TRITON and interpreting()) or torch.cuda.is_available(),
                                reason="needs triton in its CPU interpreter (TRITON_INTERPRET=1, no GPU)")

ENTRY = {"qwen3_next": "add_rms_norm_softmax_topk_triton", "kimi_linear": "add_rms_norm_group_topk_triton"}


@pytest.mark.parametrize("family", sorted(ENTRY))
def test_decode_logits_with_the_norm_in_the_router(family, tmp_path, monkeypatch):
    from hybridcache.models.loader import load_model
    from hybridcache.ops.moe import routers_triton
    from tests.models import helpers, test_kimi_linear, test_qwen3_next

    save = {"qwen3_next": test_qwen3_next.save_tiny, "kimi_linear": test_kimi_linear.save_tiny}[family]
    path, _ = save(tmp_path / family)
    model = load_model(path)
    moe_layers = sum(hasattr(m, "forward_routed") for m in model.modules())
    calls = record_calls(monkeypatch, routers_triton, ENTRY[family])

    def decode(fold: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(moe, "FOLD_NORM", fold)
        drv = helpers.Driver(model)
        drv.prefill({"a": [3 + i % 7 for i in range(9)], "b": [4 + i % 5 for i in range(6)]})
        out = []
        with kernels_on_cpu():
            for a, b in ((5, 8), (9, 2), (4, 6)):
                out += drv.step([], [("a", [a]), ("b", [b])])
                drv.accept()
        return out

    apart = decode(False)
    assert calls == []
    folded = decode(True)
    assert moe_layers >= 1 and len(calls) == 3 * moe_layers
    for a, f in zip(apart, folded):
        torch.testing.assert_close(f, a, atol=1e-5, rtol=1e-5)
