"""The gemv with the MLP activation applied to its input as it loads it (`gemv_triton(act=...)`,
`ops/linear.activated_linear`, FUSE_ACT) against the activation's own launch and then the gemv: the same values
bit for bit (the activation's roundings are the kernel's, the product the same kernel's), and within a rounding
of fp64's; rows 1 to 4, widths off the tiles, a gate/up row wider than 2K, typed errors; and the MLPs taking one
launch with FUSE_ACT on. Runs on CUDA, or on CPU tensors in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridcache.ops import linear as linear_op
from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable
from tests.ops.dispatch import record_calls

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops import gemv_triton as gemv_module  # noqa: E402
from hybridcache.ops.activation_triton import relu2_triton, silu_mul_triton  # noqa: E402
from hybridcache.ops.gemv_triton import gemv_triton  # noqa: E402

TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 1.6e-2)}  # atol, rtol: fp32 sums; two bf16 roundings


def inputs(M: int, N: int, K: int, width: int, dtype, bias: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, width, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype).to(DEVICE)
    b = torch.randn(N, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, w, b


def exact(act: str, x: torch.Tensor, K: int) -> torch.Tensor:
    """fp64 of the activation torch computes (rounded to x's dtype where torch rounds)."""
    if act == "relu2":
        return torch.square(F.relu(x)).double()
    return (F.silu(x[:, :K]) * x[:, K : 2 * K]).double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act", ["relu2", "silu_mul"])
@pytest.mark.parametrize("M,N,K", [(1, 37, 300), (2, 64, 256), (3, 20, 513), (4, 9, 40)])
def test_equals_the_activation_then_the_gemv(M, N, K, act, dtype):
    width = 2 * K + 3 if act == "silu_mul" else K  # silu_mul: columns past 2K (extra rows) are not read
    x, w, b = inputs(M, N, K, width, dtype, bias=M % 2 == 1, seed=M + N)
    y = gemv_triton(x, w, b, act=act)
    h = relu2_triton(x) if act == "relu2" else silu_mul_triton(x, K)
    assert y.dtype == dtype and y.shape == (M, N)
    assert torch.equal(y, gemv_triton(h, w, b))
    ref = exact(act, x, K) @ w.double().T + (0 if b is None else b.double())
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.double().cpu(), ref.cpu(), atol=atol, rtol=rtol)


def test_reads_a_strided_row():
    """x as the first columns of a wider tensor (a row stride past its width) gives the contiguous x's values."""
    x, w, _ = inputs(2, 24, 96, 96, torch.float32, False, seed=5)
    wide = torch.cat([x, -x], dim=1)[:, :96]
    assert not wide.is_contiguous()
    assert torch.equal(gemv_triton(wide, w, act="relu2"), gemv_triton(x, w, act="relu2"))


def test_typed_errors():
    x, w, _ = inputs(1, 8, 16, 16, torch.float32, False, seed=0)
    with pytest.raises(ValueError, match="act 'gelu'"):
        gemv_triton(x, w, act="gelu")
    with pytest.raises(ValueError, match=r"\[M, >= 2K\]"):
        gemv_triton(x, w, act="silu_mul")  # 16 columns for K = 16: the up half is missing
    with pytest.raises(ValueError, match="'relu2' or 'silu_mul'"):
        linear_op.activated_linear(x, "gelu", w)


@pytest.mark.parametrize("act", ["relu2", "silu_mul"])
def test_activated_linear_takes_one_launch_with_fuse_act(monkeypatch, act):
    """One row with FUSE_ACT: one gemv call with the activation; without it, or at more rows than GEMV_ROWS, the
    activation's launch and then the GEMM; the one-row values bit for bit either way."""
    calls = record_calls(monkeypatch, gemv_module, "gemv_triton")
    x, w, b = inputs(2, 16, 32, 64 if act == "silu_mul" else 32, torch.float32, True, seed=7)
    with kernels_on_cpu() if DEVICE == "cpu" else torch.no_grad():
        apart = linear_op.activated_linear(x[:1], act, w, b)
        assert calls == ["gemv_triton"]  # the GEMM only, its input activated by its own launch
        monkeypatch.setattr(linear_op, "FUSE_ACT", True)
        calls.clear()
        fused = linear_op.activated_linear(x[:1], act, w, b)
        assert calls == ["gemv_triton"]
        two_rows = linear_op.activated_linear(x, act, w, b)
        assert calls == ["gemv_triton"]  # two rows: apart, F.linear
    assert torch.equal(fused, apart)
    torch.testing.assert_close(two_rows[:1], apart, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("module", ["mlp", "gated_mlp"])
def test_mlps_fold_their_activation_into_the_down_projection(monkeypatch, module):
    """nemotron_h's relu² MLP and the gated (SiLU) MLP, one row: with FUSE_ACT the down projection's gemv applies
    the activation (one launch, act given), the output bit for bit as with it apart."""
    from hybridcache.models.layers.gated_mlp import GatedMLP
    from hybridcache.models.layers.mlp import MLP

    mlp = (MLP(48, 80, "relu2", False, DEVICE, torch.float32) if module == "mlp"
           else GatedMLP(48, 80, "silu", DEVICE, torch.float32))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    x = torch.randn(1, 48, generator=g).to(DEVICE)
    acts: list[str | None] = []
    real = gemv_module.gemv_triton

    def spy(*args, act=None, **kwargs):
        acts.append(act)
        return real(*args, act=act, **kwargs)

    monkeypatch.setattr(gemv_module, "gemv_triton", spy)
    with kernels_on_cpu() if DEVICE == "cpu" else torch.no_grad():
        apart = mlp(x)
        assert None in acts and all(a is None for a in acts)
        acts.clear()
        monkeypatch.setattr(linear_op, "FUSE_ACT", True)
        fused = mlp(x)
    assert acts == [None, "relu2" if module == "mlp" else "silu_mul"]  # up (gate/up), then down with the act
    assert torch.equal(fused, apart)
