"""The one-row gemv's epilogues in the models (`ops/linear.py` GEMV_EPILOGUES): a lone request's decode steps
fold each recurrent mixer's conv update into its input projection (`conv_projection.project`) and nemotron_h's
relu² into its up projection, and give bit for bit the logits and every recurrent role of the same steps with
the epilogues off; a step of two rows keeps the separate launches. Tiny checkpoints of the three families;
the decode steps through the Triton kernels on CUDA, or on CPU in Triton's interpreter (`kernels_on_cpu`)."""
from __future__ import annotations

import contextlib

import pytest
import torch

from hybridcache.ops import linear as linear_op
from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable
from hybridcache.models import load_model
from hybridcache.models.layers import gdn_mixer, kda_mixer, mamba2_mixer
from tests.models.helpers import Driver
from tests.models.helpers import save_tiny as save_nemotron_h
from tests.models.test_kimi_linear import save_tiny as save_kimi_linear
from tests.models.test_qwen3_next import save_tiny as save_qwen3_next
from tests.ops.dispatch import record_calls

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

SAVERS = {"nemotron_h": save_nemotron_h, "qwen3_next": save_qwen3_next, "kimi_linear": save_kimi_linear}
MIXERS = {"nemotron_h": mamba2_mixer, "qwen3_next": gdn_mixer, "kimi_linear": kda_mixer}


@pytest.fixture(scope="module", params=sorted(SAVERS))
def model(request, tmp_path_factory):
    path, _ = SAVERS[request.param](tmp_path_factory.mktemp(request.param))
    return request.param, load_model(path, device=DEVICE)


def decode(model, monkeypatch, epilogues: bool, rows: tuple[str, ...]) -> tuple[list[torch.Tensor], dict, list]:
    """Prefill `rows`, then 3 decode steps of all of them; -> (every step's logits, the recurrent roles after,
    the mixers' separate conv launches and relu² launches after a GEMM)."""
    family, m = model
    monkeypatch.setattr(linear_op, "GEMV_EPILOGUES", epilogues)
    drv = Driver(m, device=DEVICE)
    g = torch.Generator().manual_seed(2)
    ids = lambda n: torch.randint(3, 90, (n,), generator=g).tolist()  # noqa: E731
    logits = drv.prefill({r: ids(7 + i) for i, r in enumerate(rows)})  # context rows: the torch paths
    convs = record_calls(monkeypatch, MIXERS[family], "causal_conv1d_update")
    relus = record_calls(monkeypatch, linear_op, "relu2")  # linear_relu2's separate launch
    with kernels_on_cpu() if DEVICE == "cpu" else contextlib.nullcontext():
        for _ in range(3):
            logits += drv.step([], [(r, ids(1)) for r in rows], speculative=False)
            drv.accept()
    roles = {f"{s}.{r}": t.clone() for s, by_role in drv.mgr.store.device_tier.by_module.items()
             for r, t in by_role.items()}
    monkeypatch.undo()
    return logits, roles, convs + relus


def test_one_row_decode_folds_and_changes_no_bit(model, monkeypatch):
    on_logits, on_roles, on_convs = decode(model, monkeypatch, True, ("a",))
    off_logits, off_roles, off_convs = decode(model, monkeypatch, False, ("a",))
    assert on_convs == [] and "causal_conv1d_update" in off_convs  # folded: no separate conv (or relu²) launch
    assert ("relu2" in off_convs) == (model[0] == "nemotron_h")  # its MLP layers
    for got, want in zip(on_logits, off_logits, strict=True):
        assert torch.equal(got, want)
    assert on_roles.keys() == off_roles.keys()
    for name in on_roles:
        assert torch.equal(on_roles[name].nan_to_num(), off_roles[name].nan_to_num()), name


def test_two_rows_keep_the_separate_conv(model, monkeypatch):
    _, _, convs = decode(model, monkeypatch, True, ("a", "b"))
    assert "causal_conv1d_update" in convs  # and relu² its own launch: two rows are past the gemv (GEMV_ROWS)
    assert ("relu2" in convs) == (model[0] == "nemotron_h")
