"""relu(x)² in one Triton launch (`ops/activation_triton.py`) against torch's two ops, bit for bit: fp32,
bf16 and fp16, negatives, zeros, values whose square rounds, sizes off the block, and the MLP's
dispatch to it. Runs on CUDA, or on CPU tensors in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops.activation_triton import BLOCK, relu2_triton  # noqa: E402

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
