"""The fused routers (`ops/moe/routers_triton.py`) against the routers' own torch forwards
(`models/layers/routers.py`) and the per-token references (`ops/moe/naive.py`): softmax top-k and grouped
top-k, with the logits computed in the kernel, in 16-column steps, or by F.linear. Runs on CUDA, or on CPU
tensors in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where there is no CUDA device).
Tolerances: indices equal; weights rtol 1e-5 / atol 1e-6 in fp32 (exp and the divisions may differ by an
ulp), one ulp in bf16. Random logits hold no ties; `test_ties_take_the_lowest_index` checks the tie rule.
"""
import pytest
import torch

from hybridcache.ops.triton_support import triton_testable

if not triton_testable(torch.empty(0, device="cuda" if torch.cuda.is_available() else "cpu")):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.models.layers import routers  # noqa: E402
from hybridcache.ops.moe import naive, routers_triton  # noqa: E402
from tests.ops.moe_testing import BF16, D, DEVICE, F32, filled, launches, randn  # noqa: E402,F401


ROUTER_CASES = [(8, 2, True), (12, 3, False), (5, 1, True)]  # (E, k, renormalise); 12, 5: padded tiles
# where the Triton forward gets its logits: in the kernel (W's columns in one step at D = 72, or in 16-column
# steps, the last one masked), or from F.linear (`fuses_logits` turned off)
LOGITS = {"logits in the kernel": "kernel", "in 16-column steps": "steps", "logits by F.linear": "linear"}


def router_paths(monkeypatch, launches, module: torch.nn.Module, x: torch.Tensor, source: str):
    """(torch forward, Triton forward) of a router whose Triton forward takes its logits from `source`
    (in the kernel F.linear raises)."""
    in_kernel = source != "linear"
    if source == "steps":
        monkeypatch.setattr(routers_triton, "LOGIT_TILE", 16)
    if source == "linear":
        monkeypatch.setattr(routers_triton, "FUSED_MAX_MACS", 0)
    ref = module(x)
    monkeypatch.setattr(routers, "runs_triton", lambda t: True)
    if in_kernel:
        def no_gemm(*args, **kw):
            raise AssertionError("F.linear ran: the logits were not computed in the kernel")
        monkeypatch.setattr(routers.F, "linear", no_gemm)
    out = module(x)
    monkeypatch.undo()
    assert launches, "the forward did not take the Triton path"
    return ref, out


@pytest.mark.parametrize("source", LOGITS.values(), ids=LOGITS.keys())
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("e, k, renormalise", ROUTER_CASES)
def test_softmax_router(monkeypatch, launches, e, k, renormalise, dtype, source):
    module = filled(routers.SoftmaxTopKRouter(D, e, k, renormalise, DEVICE, dtype), seed=e)
    x = randn(7, D, seed=1, dtype=dtype)
    monkeypatch.setattr(routers, "runs_triton", lambda t: False)
    (ref_index, ref_weight), (index, weight) = router_paths(monkeypatch, launches, module, x, source)
    assert torch.equal(index, ref_index) and index.dtype == torch.int64
    assert weight.dtype == ref_weight.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == F32 else dict(rtol=2 ** -7, atol=0.0)
    torch.testing.assert_close(weight, ref_weight, **tol)
    logits = torch.nn.functional.linear(x, module.weight)
    loop_index, loop_weight = naive.softmax_topk_naive(logits, k, renormalise)
    assert torch.equal(index, loop_index)
    torch.testing.assert_close(weight, loop_weight, **tol)


GROUP_CASES = [(8, 1, 1, 2, True), (16, 4, 2, 3, True), (12, 3, 2, 4, False), (8, 4, 4, 1, True)]


@pytest.mark.parametrize("source", LOGITS.values(), ids=LOGITS.keys())
@pytest.mark.parametrize("x_dtype", [F32, BF16], ids=["x fp32", "x bf16"])
@pytest.mark.parametrize("e, n_group, topk_group, k, renormalise", GROUP_CASES)
def test_group_router(monkeypatch, launches, e, n_group, topk_group, k, renormalise, x_dtype, source):
    """Sigmoid scores, a correction bias large enough to change choices, n_group 1 and > 1; fp32 weights,
    x in fp32 or 16-bit (taken to fp32 before the GEMM)."""
    module = filled(routers.TopKRouter(D, e, k, n_group, topk_group, renormalise, 2.5, DEVICE), seed=e)
    module.e_score_correction_bias.copy_(randn(e, seed=3, scale=0.3))
    x = randn(9, D, seed=1, scale=3.0, dtype=x_dtype)
    monkeypatch.setattr(routers, "runs_triton", lambda t: False)
    (ref_index, ref_weight), (index, weight) = router_paths(monkeypatch, launches, module, x, source)
    assert torch.equal(index, ref_index) and index.dtype == torch.int64 and weight.dtype == F32
    torch.testing.assert_close(weight, ref_weight, rtol=1e-5, atol=1e-6)
    logits = torch.nn.functional.linear(x.float(), module.weight)
    loop = naive.group_topk_naive(logits, module.e_score_correction_bias, k, n_group, topk_group, renormalise, 2.5)
    assert torch.equal(index, loop[0])
    torch.testing.assert_close(weight, loop[1], rtol=1e-5, atol=1e-6)


def test_group_limit_changes_the_choice():
    """The best two experts lie in one group; with one group kept the second pick must come from it, with
    every group kept it is the global second best (so the group mask is not a no-op)."""
    logits = torch.tensor([[4.0, 3.0, -4.0, -4.0, 3.5, -5.0, -5.0, -5.0]], device=DEVICE)
    bias = torch.zeros(8, device=DEVICE)
    one, _ = routers_triton.group_topk_triton(logits, bias, 2, 2, 1, True, 1.0)
    every, _ = routers_triton.group_topk_triton(logits, bias, 2, 2, 2, True, 1.0)
    assert one.tolist() == [[0, 1]] and every.tolist() == [[0, 4]]


def test_ties_take_the_lowest_index():
    """Our rule on ties, in every selection: the lowest index first (torch's CPU topk does not promise an
    order: topk([1, 3, 3, 2, 3], 2) gives indices [2, 4] here)."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0]], device=DEVICE)
    index, _ = routers_triton.softmax_topk_triton(logits, 2, False)
    assert index.tolist() == [[1, 2]] == naive.softmax_topk_naive(logits, 2, False)[0].tolist()
    # groups of 2: {3, 3} (0) ties {3, 3} (1) on its two best, then two equal experts in group 0
    logits = torch.tensor([[3.0, 3.0, 3.0, 3.0, 1.0, 0.0]], device=DEVICE)
    index, _ = routers_triton.group_topk_triton(logits, torch.zeros(6, device=DEVICE), 2, 3, 1, False, 1.0)
    assert index.tolist() == [[0, 1]]
