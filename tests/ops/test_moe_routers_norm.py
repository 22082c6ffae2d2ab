"""The routers with a pre-norm block's residual add and RMSNorm run in their launch (`routers_triton.add_rms_norm_*`)
against the two launches they replace (`add_rms_norm_triton`, then the router on its output): the stream bit for
bit, h within one rounding (its sum of squares runs in another order), the same experts, and the weights as the
router gives them from that h. Rows 1 and 3 (the interpreter takes several a program), D off the tile, the row in
one step and in 16-column steps, a zero-centred norm weight, both routers. Runs on CUDA, or on CPU tensors in the
interpreter."""
import pytest
import torch

from hybridcache.ops.triton_support import triton_testable

if not triton_testable(torch.empty(0, device="cuda" if torch.cuda.is_available() else "cpu")):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.ops.moe import routers_triton  # noqa: E402
from hybridcache.ops.moe.routers_triton import AddNorm  # noqa: E402
from hybridcache.ops.rms_norm_triton import add_rms_norm_triton  # noqa: E402
from tests.ops.moe_testing import BF16, DEVICE, F32  # noqa: E402

EPS = 1e-6
ULP = {F32: 2 ** -22, BF16: 2 ** -7}  # relative: one rounding of the dtype (and a few of fp32)


@pytest.fixture(params=["one step", "16-column steps"])
def steps(request, monkeypatch):
    if request.param == "16-column steps":
        monkeypatch.setattr(routers_triton, "LOGIT_TILE", 16)
        monkeypatch.setattr(routers_triton, "ONE_TOKEN_TILE", 16)
    return request.param


def rows_in(N: int, D: int, dtype, zero_centred: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    x, delta = ((torch.randn(N, D, generator=g) * 2).to(dtype).to(DEVICE) for _ in range(2))
    nw = (torch.randn(D, generator=g) * 0.1 + (0.0 if zero_centred else 1.0)).to(dtype).to(DEVICE)
    return x, delta, nw, g


def two_launches_h(h, stream, x, delta, nw, zero_centred, dtype):
    """The norm kernel's h, checked against the folded launch's outputs; returned for the router."""
    h_ref, stream_ref = add_rms_norm_triton(x, delta, nw, EPS, zero_centred)
    assert torch.equal(stream, stream_ref)
    torch.testing.assert_close(h, h_ref, rtol=ULP[dtype], atol=1e-6)
    return h_ref


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("N,zero_centred", [(1, False), (3, True)])
def test_softmax_router_runs_the_norm(N, dtype, zero_centred, steps):
    D, E, k = 72, 12, 3
    x, delta, nw, g = rows_in(N, D, dtype, zero_centred, seed=N)
    w = (torch.randn(E, D, generator=g) / D ** 0.5).to(dtype).to(DEVICE)
    index, weight, h, stream = routers_triton.add_rms_norm_softmax_topk_triton(
        x, AddNorm(delta, nw, EPS, zero_centred), k, True, w)
    h_ref = two_launches_h(h, stream, x, delta, nw, zero_centred, dtype)
    index_ref, weight_ref = routers_triton.softmax_topk_triton(h_ref, k, True, weight=w)
    assert torch.equal(index, index_ref)
    torch.testing.assert_close(weight, weight_ref, rtol=2 * ULP[dtype], atol=1e-6)
    # the logits are taken from h as stored: the router on that h gives the same weights bit for bit
    assert torch.equal(weight, routers_triton.softmax_topk_triton(h, k, True, weight=w)[1])


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("N,zero_centred", [(1, True), (3, False)])
def test_group_router_runs_the_norm(N, dtype, zero_centred, steps):
    D, E, k, groups, kept = 40, 16, 3, 4, 2
    x, delta, nw, g = rows_in(N, D, dtype, zero_centred, seed=10 + N)
    w = (torch.randn(E, D, generator=g) / D ** 0.5).to(DEVICE)
    bias = (torch.randn(E, generator=g) * 0.1).to(DEVICE)
    index, weight, h, stream = routers_triton.add_rms_norm_group_topk_triton(
        x, AddNorm(delta, nw, EPS, zero_centred), bias, k, groups, kept, True, 2.5, w)
    h_ref = two_launches_h(h, stream, x, delta, nw, zero_centred, dtype)
    index_ref, weight_ref = routers_triton.group_topk_triton(h_ref, bias, k, groups, kept, True, 2.5, weight=w)
    assert torch.equal(index, index_ref)
    torch.testing.assert_close(weight, weight_ref, rtol=2 * ULP[dtype], atol=1e-6)
    assert torch.equal(weight, routers_triton.group_topk_triton(h, bias, k, groups, kept, True, 2.5, weight=w)[1])


def test_a_mismatched_delta_is_refused_before_any_launch():
    x, delta, nw, g = rows_in(2, 40, F32, False, seed=0)
    w = torch.randn(16, 40, generator=g).to(DEVICE)
    bias = torch.zeros(16, device=DEVICE)
    with pytest.raises(ValueError, match="delta"):
        routers_triton.add_rms_norm_group_topk_triton(x, AddNorm(delta[:1], nw, EPS, False), bias, 2, 4, 2, True, 1.0, w)


@pytest.mark.parametrize("router", ["softmax", "group"])
def test_weights_before_the_wait_change_no_bit(router, monkeypatch):
    """W loaded before the kernel's PDL wait (`WEIGHTS_BEFORE_WAIT`, W in one step) against loaded in the step
    that multiplies it: every output bit for bit, with the norm run in the launch and without."""
    N, D, E, k = 3, 40, 16, 3
    x, delta, nw, g = rows_in(N, D, BF16, False, seed=5)
    w = (torch.randn(E, D, generator=g) / D ** 0.5).to(DEVICE)
    bias = (torch.randn(E, generator=g) * 0.1).to(DEVICE)

    def run():
        if router == "softmax":
            wb = w.to(BF16)
            return (routers_triton.add_rms_norm_softmax_topk_triton(x, AddNorm(delta, nw, EPS, False), k, True, wb)
                    + routers_triton.softmax_topk_triton(x, k, True, weight=wb))
        return (routers_triton.add_rms_norm_group_topk_triton(x, AddNorm(delta, nw, EPS, False), bias, k, 4, 2,
                                                              True, 2.5, w)
                + routers_triton.group_topk_triton(x, bias, k, 4, 2, True, 2.5, weight=w))

    choices, choose = [], routers_triton._w_first
    monkeypatch.setattr(routers_triton, "_w_first", lambda *a: choices.append(choose(*a)) or choices[-1])
    first = run()
    assert choices == [True, True], f"W not loaded before the wait in both launches: {choices}"
    monkeypatch.setattr(routers_triton, "WEIGHTS_BEFORE_WAIT", False)
    second = run()
    assert choices[2:] == [False, False], choices
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
