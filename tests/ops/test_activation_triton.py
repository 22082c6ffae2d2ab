"""The MLP glue kernels (`ops/activation_triton.py`) against torch's ops: relu(x)² bit for bit (fp32, bf16,
fp16, negatives, zeros, values whose square rounds, sizes off the block) and the MLP's dispatch to it;
silu(gate) * up on a fused GEMM's halves, base + sigmoid(g) * x and x * sigmoid(gate) against torch's ops on
the same device (in the interpreter bit for bit in bf16 and fp16 and within fp32 rounding in fp32; on CUDA
the kernels' exp is ex2.approx, not CUDA's expf, whose last-bit differences can flip a 16-bit rounding, so
there within two ulps of the product, and one of the sum more for base + product: fp16 on the H200 differed
in 60 of 4,106 sums, by up to 0.027 of a sum where base and the product cancel), and the gated MLP's and the shared-expert MoE's dispatch to them. Runs on
CUDA, or on CPU tensors in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable
from tests.ops.dispatch import record_calls

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops.activation_triton import (  # noqa: E402
    BLOCK, relu2_triton, sigmoid_gated_add_triton, sigmoid_mul_triton, silu_mul_triton)

BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(3, 7), (2, BLOCK + 5), (0, 4)])
def test_relu2_equals_torch_bit_for_bit(dtype, shape):
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))) * 3).to(dtype)
    if x.numel():
        x.view(-1)[:3] = torch.tensor([0.0, -0.0, -5.0]).to(dtype)
    want = torch.square(F.relu(x))
    got = relu2_triton(x.to(DEVICE)).cpu()
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got.view(BITS[dtype]), want.view(BITS[dtype]))


@pytest.mark.skipif(DEVICE != "cpu", reason="routes CPU tensors through the kernel (the interpreter)")
def test_the_mlp_activation_dispatches_to_the_kernel(monkeypatch):
    from hybridcache.models.layers import mlp
    import hybridcache.ops.activation_triton as act

    calls = []
    monkeypatch.setattr(act, "relu2_triton", lambda x, _real=act.relu2_triton: (calls.append(x.shape), _real(x))[1])
    x = torch.randn(4, 6).to(torch.bfloat16)
    with kernels_on_cpu():
        got = mlp.ACTIVATIONS["relu2"](x)
        strided = mlp.ACTIVATIONS["relu2"](x.t())  # not contiguous: torch's ops
    assert calls == [(4, 6)]
    assert torch.equal(got, torch.square(F.relu(x))) and torch.equal(strided, torch.square(F.relu(x.t())))


def assert_matches(got, want, addend=None):
    """got (a kernel's) against want (torch's ops on the same device). `addend`: where want is a sum, the
    product added last, whose ulps (not the sum's, which may cancel to far less) bound the flips in it."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype != torch.float32 and got.is_cuda:
        # a flipped rounding of the activation, then of the product: two ulps of the product; an added product
        # then one ulp of the sum more (see the module docstring)
        bound = 2 * want.abs().float() if addend is None else 2 * addend.abs().float() + want.abs().float()
        excess = (got.float() - want.float()).abs() - torch.finfo(want.dtype).eps * bound
        assert excess.numel() == 0 or excess.max() <= 1e-6, f"off by more than the ulps allowed: {excess.max():.3g}"
    elif want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    else:
        assert torch.equal(got.view(BITS[want.dtype]), want.view(BITS[want.dtype]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,inner,extra", [(3, 7, 0), (2, BLOCK + 5, 1), (0, 4, 0)])
def test_silu_mul_on_a_fused_gemm_output_equals_torch(dtype, rows, inner, extra):
    h = (torch.randn(rows, 2 * inner + extra, generator=torch.Generator().manual_seed(inner)) * 4).to(dtype).to(DEVICE)
    want = F.silu(h[:, :inner]) * h[:, inner : 2 * inner]
    assert_matches(silu_mul_triton(h, inner), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,width", [(3, 7), (2, BLOCK + 5), (0, 4)])
def test_sigmoid_gated_add_equals_torch(dtype, rows, width):
    gen = torch.Generator().manual_seed(width)
    base, x = (torch.randn(rows, width, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
    g = (torch.randn(rows, 3, generator=gen) * 4).to(dtype).to(DEVICE)[:, 1:2]  # a column of a wider output
    gated = torch.sigmoid(g) * x
    assert_matches(sigmoid_gated_add_triton(base, x, g), base + gated, addend=gated)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,heads,dim", [(3, 2, 8), (2, 3, BLOCK // 2 + 3), (0, 2, 4)])
def test_sigmoid_mul_on_a_strided_gate_equals_torch(dtype, rows, heads, dim):
    qg = (torch.randn(rows, heads, 2 * dim, generator=torch.Generator().manual_seed(dim)) * 4).to(dtype).to(DEVICE)
    x, gate = qg[..., :dim].reshape(rows, heads * dim).contiguous(), qg[..., dim:]  # the gate: a strided half
    want = x * torch.sigmoid(gate).reshape(rows, heads * dim)
    assert_matches(sigmoid_mul_triton(x, gate), want)


@pytest.mark.skipif(DEVICE != "cpu", reason="routes CPU tensors through the kernels (the interpreter)")
def test_the_gated_mlp_and_the_shared_expert_moe_dispatch_to_the_kernels(monkeypatch):
    import hybridcache.ops.activation_triton as act
    from hybridcache.models.layers.gated_mlp import GatedMLP
    from hybridcache.models.layers.shared_moe import SharedExpertMoE

    calls = record_calls(monkeypatch, act, "silu_mul_triton", "sigmoid_gated_add_triton")
    gen = torch.Generator().manual_seed(0)
    moe = SharedExpertMoE(16, 4, 2, 8, 12, "silu", True, "cpu", torch.bfloat16)
    for p in moe.parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    x = torch.randn(3, 16, generator=gen).to(torch.bfloat16)
    want = moe(x)  # the torch paths
    with kernels_on_cpu():
        got = moe(x)
    assert calls == ["silu_mul_triton", "sigmoid_gated_add_triton"]
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)  # the routed experts' kernels sum in fp32
    mlp = moe.shared_expert
    assert isinstance(mlp, GatedMLP) and mlp.gate_weight.data_ptr() == mlp.gate_up_weight.data_ptr()
    assert moe.checkpoint_tensors()["shared_expert_gate.weight"].shape == (1, 16)
    fresh = GatedMLP(16, 12, "silu", "cpu", torch.bfloat16, extra_rows=1)  # the GEMM's rows padded to 8, zeros
    assert fresh.gate_up_weight.shape == (32, 16) and not fresh.gate_up_weight[25:].any()
    assert fresh.extra_weight.shape == (1, 16) and fresh.forward_extra(x)[1].shape == (3, 1)
