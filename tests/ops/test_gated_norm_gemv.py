"""A mixer's gated RMSNorm folded into the projection after it, one row (`gemv_triton.gated_norm_gemv_triton`,
`GatedNorm.project`, FUSE_GATED_NORM), against the two launches (the norm's kernel, then the gemv) and against
fp64 of the torch norm's output: each mode (Mamba2's group norm, GDN's SiLU-gated and KDA's sigmoid-gated
head norms), groups that fill a step, a partial step and more than one step, a strided gate, bias or none, and
typed errors. The normalised row takes the norm kernel's roundings; the product sums in fp32 in another order,
so the fold agrees with the two launches within a rounding of the result (bf16: 2^-8 relative, twice for
margin). Runs on CUDA, or on CPU tensors in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch

from hybridcache.ops import linear as linear_op
from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable
from tests.ops.dispatch import record_calls

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.models.layers.norm import GatedGroupRMSNorm, GatedRMSNorm, SigmoidGatedRMSNorm  # noqa: E402
from hybridcache.models.layers.mlp import Linear  # noqa: E402
from hybridcache.ops import gemv_triton as gemv_module  # noqa: E402
from hybridcache.ops.gemv_triton import NORM_BLOCK_K, gated_norm_gemv_triton, gemv_triton  # noqa: E402

EPS = 1e-5
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 1.6e-2)}  # atol, rtol


def norm_module(mode: str, G: int, GS: int, dtype):
    if mode == "group":
        return GatedGroupRMSNorm(G * GS, G, EPS, DEVICE, dtype)
    return (GatedRMSNorm if mode == "silu" else SigmoidGatedRMSNorm)(GS, EPS, DEVICE, dtype)


def inputs(mode: str, G: int, GS: int, N: int, dtype, bias: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    norm = norm_module(mode, G, GS, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(norm.weight.shape, generator=g) * 0.2 + 1.0)
    y = torch.randn(1, G, GS, generator=g).to(dtype).to(DEVICE)
    z = torch.randn(1, G, 2 * GS, generator=g).to(dtype).to(DEVICE)[:, :, GS:]  # a group stride of 2·GS
    w = (torch.randn(N, G * GS, generator=g) / (G * GS) ** 0.5).to(dtype).to(DEVICE)
    b = torch.randn(N, generator=g).to(dtype).to(DEVICE) if bias else None
    return norm, y, z, w, b


def normed_apart(norm, mode: str, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The norm's own output for the [1, width] row (its Triton kernel on CUDA / in the interpreter)."""
    if mode == "group":
        return norm(y.reshape(1, -1), z.reshape(1, -1))
    return norm(y, z).reshape(1, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["group", "silu", "sigmoid"])
@pytest.mark.parametrize("G,GS,N", [(3, 16, 37), (40, 16, 9), (2, 64, 24), (1, NORM_BLOCK_K * 2, 5)])
def test_matches_the_two_launches_and_fp64(mode, G, GS, N, dtype):
    """G·GS at 48 (a partial step), 640 (two steps of NORM_BLOCK_K / GS groups, the second partial), 128, and a
    group wider than the step (one group a step)."""
    norm, y, z, w, b = inputs(mode, G, GS, N, dtype, bias=N % 2 == 1, seed=G + GS + N)
    with kernels_on_cpu() if DEVICE == "cpu" else torch.no_grad():
        out = gated_norm_gemv_triton(y, z, norm.weight, EPS, mode, w, b)
        two = gemv_triton(normed_apart(norm, mode, y, z), w, b)
    assert out.shape == (1, N) and out.dtype == two.dtype
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.cpu(), two.cpu(), atol=atol, rtol=rtol)
    torch_normed = normed_apart(norm.cpu(), mode, y.cpu(), z.cpu())  # the torch reference (no Triton on CPU tensors)
    ref = torch_normed.double() @ w.double().cpu().T + (0 if b is None else b.double().cpu())
    torch.testing.assert_close(out.double().cpu(), ref, atol=atol, rtol=rtol)


def test_a_group_the_kernel_would_misread_changes_the_result():
    """The group sums matter: the same values grouped as 4 x 32 and as 2 x 64 give different outputs, each equal
    to its own two launches (a fold that normalised over the wrong span would match only one)."""
    norm4, y, z, w, _ = inputs("group", 4, 32, 16, torch.float32, False, seed=3)
    norm2 = GatedGroupRMSNorm(128, 2, EPS, DEVICE, torch.float32)
    with torch.no_grad():
        norm2.weight.copy_(norm4.weight)
    with kernels_on_cpu() if DEVICE == "cpu" else torch.no_grad():
        four = gated_norm_gemv_triton(y, z, norm4.weight, EPS, "group", w)
        two = gated_norm_gemv_triton(y.reshape(1, 2, 64), z.reshape(1, 2, 64), norm2.weight, EPS, "group", w)
        ref2 = gemv_triton(norm2(y.reshape(1, -1), z.reshape(1, -1)), w)
    torch.testing.assert_close(two, ref2, atol=2e-5, rtol=2e-5)
    assert (four - two).abs().max() > 1e-3


def test_typed_errors():
    norm, y, z, w, b = inputs("silu", 4, 16, 8, torch.float32, True, seed=0)
    with pytest.raises(ValueError, match="mode 'relu'"):
        gated_norm_gemv_triton(y, z, norm.weight, EPS, "relu", w)
    with pytest.raises(ValueError, match=r"one \[1, G, GS\] each"):
        gated_norm_gemv_triton(y.reshape(1, -1), z, norm.weight, EPS, "silu", w)
    with pytest.raises(ValueError, match="power of two"):
        gated_norm_gemv_triton(y.reshape(1, 8, 8)[:, :, :6], z.reshape(1, 8, 8)[:, :, :6], norm.weight[:6], EPS,
                               "silu", w[:, :48])
    with pytest.raises(ValueError, match="norm weight"):
        gated_norm_gemv_triton(y, z, norm.weight.repeat(4), EPS, "silu", w)
    with pytest.raises(ValueError, match=r"weight \(8, 32\)"):
        gated_norm_gemv_triton(y, z, norm.weight, EPS, "silu", w[:, :32])
    with pytest.raises(ValueError, match="bias"):
        gated_norm_gemv_triton(y, z, norm.weight, EPS, "silu", w, b[:3])


@pytest.mark.parametrize("mode", ["group", "silu", "sigmoid"])
def test_project_folds_one_row_with_fuse_gated_norm(monkeypatch, mode):
    """`GatedNorm.project`: one row with FUSE_GATED_NORM, one launch (the fold), the two launches' values within
    rounding; without the flag, or at two rows, the norm and then the projection."""
    norm, y, z, w, b = inputs(mode, 4, 16, 12, torch.float32, True, seed=9)
    proj = Linear(64, 12, True, DEVICE, torch.float32)
    with torch.no_grad():
        proj.weight.copy_(w)
        proj.bias.copy_(b)
    if mode == "group":  # Mamba2's [N, I] rows
        y, z = y.reshape(1, -1), z.reshape(1, -1)
    calls = record_calls(monkeypatch, gemv_module, "gated_norm_gemv_triton")
    with kernels_on_cpu() if DEVICE == "cpu" else torch.no_grad():
        apart = norm.project(y, z, proj)
        monkeypatch.setattr(linear_op, "FUSE_GATED_NORM", True)
        assert calls == []
        folded = norm.project(y, z, proj)
        assert calls == ["gated_norm_gemv_triton"]
        two_rows = norm.project(torch.cat([y, y]), torch.cat([z, z]), proj)
        assert calls == ["gated_norm_gemv_triton"]
    assert folded.shape == apart.shape == (1, 12) and two_rows.shape == (2, 12)
    torch.testing.assert_close(folded, apart, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(two_rows[1:], apart, atol=2e-5, rtol=2e-5)
