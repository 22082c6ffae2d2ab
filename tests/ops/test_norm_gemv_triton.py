"""The one-launch residual add + RMSNorm + GEMM of one row (`gemv_triton.add_rms_norm_gemv_triton`) against
fp64 of the same math and against the two-launch path (`add_rms_norm_triton`, then `gemv_triton`): the stream
bit for bit as torch's `x + delta`; y within the fp64 result's rounding plus fp32 accumulation (the fused path
does not round the normalised row to the dtype, so against the two-launch path bf16 gets one more rounding:
2^-7 relative). Widths off the tiles, a zero-centred weight, bias or none, no delta, and typed errors. Runs on
CUDA, or on CPU tensors in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch

from hybridcache.ops.triton_support import triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops.gemv_triton import add_rms_norm_gemv_triton, gemv_triton  # noqa: E402
from hybridcache.ops.rms_norm_triton import add_rms_norm_triton, rms_norm_triton  # noqa: E402

EPS = 1e-5
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 8e-3)}  # atol, rtol against fp64


def inputs(N: int, K: int, dtype, bias: bool, zero_centred: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, delta = (torch.randn(1, K, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    nw = (torch.randn(K, generator=g) * 0.1 + (0.0 if zero_centred else 1.0)).to(dtype).to(DEVICE)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype).to(DEVICE)
    b = torch.randn(N, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, delta, nw, w, b


def reference(stream: torch.Tensor, nw: torch.Tensor, zero_centred: bool, w: torch.Tensor, b: torch.Tensor | None):
    s = stream.double()
    h = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * (nw.double() + (1.0 if zero_centred else 0.0))
    y = h @ w.double().T
    return (y if b is None else y + b.double()).to(stream.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,K", [(37, 300), (64, 256), (9, 1500)])
@pytest.mark.parametrize("bias,zero_centred", [(False, False), (True, True)])
def test_matches_fp64_and_the_two_launches(N, K, dtype, bias, zero_centred):
    x, delta, nw, w, b = inputs(N, K, dtype, bias, zero_centred, seed=N + K)
    y, stream = add_rms_norm_gemv_triton(x, delta, nw, EPS, zero_centred, w, b)
    assert y.dtype == dtype and y.shape == (1, N) and stream.shape == (1, K)
    assert torch.equal(stream.cpu(), (x + delta).cpu())
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.cpu(), reference(x + delta, nw, zero_centred, w, b).cpu(), atol=atol, rtol=rtol)
    h, stream2 = add_rms_norm_triton(x, delta, nw, EPS, zero_centred)
    assert torch.equal(stream2, stream)
    two = gemv_triton(h, w, b)
    torch.testing.assert_close(y.cpu(), two.cpu(), atol=2 * atol, rtol=2 * rtol)


@pytest.mark.parametrize("block_k", [16, 128, 1024])
def test_steps_agree(block_k):
    """The step over K changes only the summation order."""
    x, delta, nw, w, b = inputs(24, 700, torch.float32, True, False, seed=5)
    y, stream = add_rms_norm_gemv_triton(x, delta, nw, EPS, False, w, b, block_k=block_k)
    assert torch.equal(stream.cpu(), (x + delta).cpu())
    torch.testing.assert_close(y.cpu(), reference(x + delta, nw, False, w, b).cpu(), atol=1e-5, rtol=1e-5)


def test_many_programs_one_stream_writer(monkeypatch):
    """At the GPU's 4 outputs a program (the interpreter's default takes up to 64), 10 programs share the row:
    program 0 alone stores the stream, every program's outputs are right."""
    from hybridcache.ops import gemv_triton as gemv_module

    monkeypatch.setattr(gemv_module, "INTERPRETER_BLOCK_N", gemv_module.BLOCK_N)
    x, delta, nw, w, b = inputs(37, 300, torch.float32, True, True, seed=6)
    y, stream = add_rms_norm_gemv_triton(x, delta, nw, EPS, True, w, b)
    assert torch.equal(stream.cpu(), (x + delta).cpu())
    torch.testing.assert_close(y.cpu(), reference(x + delta, nw, True, w, b).cpu(), atol=1e-5, rtol=1e-5)


def test_without_delta_the_stream_is_x():
    x, _, nw, w, b = inputs(20, 200, torch.float32, True, False, seed=1)
    y, stream = add_rms_norm_gemv_triton(x, None, nw, EPS, False, w, b)
    assert stream is x
    torch.testing.assert_close(y.cpu(), gemv_triton(rms_norm_triton(x, nw, EPS, False), w, b).cpu(),
                               atol=1e-5, rtol=1e-5)


def test_no_outputs_still_writes_the_stream():
    x, delta, nw, w, _ = inputs(1, 64, torch.bfloat16, False, False, seed=2)
    y, stream = add_rms_norm_gemv_triton(x, delta, nw, EPS, False, w[:0])
    assert y.shape == (1, 0) and torch.equal(stream.cpu(), (x + delta).cpu())


def test_rejects_what_it_does_not_take():
    x, delta, nw, w, b = inputs(8, 32, torch.float32, True, False, seed=3)
    with pytest.raises(ValueError, match=r"\[1, K\]"):
        add_rms_norm_gemv_triton(torch.cat([x, x]), None, nw, EPS, False, w)
    with pytest.raises(ValueError, match="delta"):
        add_rms_norm_gemv_triton(x, delta[:, :16], nw, EPS, False, w)
    with pytest.raises(ValueError, match="delta"):
        add_rms_norm_gemv_triton(x, delta.double(), nw, EPS, False, w)
    with pytest.raises(ValueError, match="norm weight"):
        add_rms_norm_gemv_triton(x, delta, nw[:16], EPS, False, w)
    with pytest.raises(ValueError, match="bias"):
        add_rms_norm_gemv_triton(x, delta, nw, EPS, False, w, b[:4])
    with pytest.raises(ValueError, match="empty"):
        add_rms_norm_gemv_triton(x[:, :0], None, nw[:0], EPS, False, w[:, :0])
