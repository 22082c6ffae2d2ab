"""The few-row GEMM (`ops/gemv_triton.py`) against an fp64 product of the same inputs: rows 1 to 4 (3: a padded
row block), widths and output counts off the tiles, bias or none, a strided x, tilings, empty shapes, and typed
errors for what it does not take. Tolerance: the fp64 product rounded to the dtype, plus fp32 accumulation
(1e-5 relative in fp32; one bf16 rounding, 2^-8 relative, in bf16). Runs on CUDA, or on CPU tensors in
Triton's interpreter."""
from __future__ import annotations

import pytest
import torch

from hybridcache.ops import linear as linear_op
from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable
from tests.ops.dispatch import record_calls

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops import gemv_triton as gemv_module  # noqa: E402
from hybridcache.ops.gemv_triton import MAX_ROWS, bmm_rows_triton, gemv_triton  # noqa: E402

TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 8e-3)}  # atol, rtol


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().T
    return (y if b is None else y + b.double()).to(x.dtype)


def inputs(M: int, N: int, K: int, dtype, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype).to(DEVICE)
    b = torch.randn(N, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 37, 300), (2, 64, 256), (3, 20, 513), (4, 9, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_the_product(M, N, K, dtype, bias):
    x, w, b = inputs(M, N, K, dtype, bias, seed=M + N)
    y = gemv_triton(x, w, b)
    assert y.dtype == dtype and y.shape == (M, N)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(y.cpu(), reference(x, w, b).cpu(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("block_n,block_k,num_warps", [(4, 64, 1), (16, 128, 2), (32, 32, 8)])
def test_tilings_agree(block_n, block_k, num_warps):
    """Tilings change only the summation order: the same values within rounding."""
    x, w, b = inputs(2, 50, 200, torch.float32, True, seed=3)
    y = gemv_triton(x, w, b, block_n=block_n, block_k=block_k, num_warps=num_warps)
    torch.testing.assert_close(y.cpu(), reference(x, w, b).cpu(), atol=1e-5, rtol=1e-5)


def test_reads_strided_rows_and_weight_views():
    """x as the first columns of a wider tensor (a row stride past its width), read in place; a weight in
    column-major order (no unit last stride) is copied: both give the contiguous inputs' values, bit for bit."""
    x_wide, w, b = inputs(4, 24, 96, torch.float32, False, seed=5)
    x = torch.cat([x_wide, x_wide], dim=1)[:, :96]
    assert not x.is_contiguous()
    y = gemv_triton(x, w)
    torch.testing.assert_close(y.cpu(), reference(x, w, None).cpu(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gemv_triton(x_wide, w).cpu(), y.cpu(), atol=0, rtol=0)
    w_t = w.T.contiguous().T  # stride (1, N): copied
    torch.testing.assert_close(gemv_triton(x_wide, w_t).cpu(), y.cpu(), atol=0, rtol=0)


def test_empty_shapes():
    x, w, b = inputs(1, 8, 16, torch.float32, True)
    assert gemv_triton(x[:0], w).shape == (0, 8)
    assert gemv_triton(x, w[:0]).shape == (1, 0)
    torch.testing.assert_close(gemv_triton(x[:, :0], w[:, :0], b), b[None])
    torch.testing.assert_close(gemv_triton(x[:, :0], w[:, :0]), torch.zeros(1, 8, device=DEVICE))


@pytest.mark.parametrize("M,bias", [(1, False), (3, True)])
def test_a_float32_output_is_the_result_widened(M, bias):
    """out_dtype float32 on bf16 inputs: bit for bit `.float()` of the bf16 result (rounded to bf16 once, then
    widened in the same launch), as the LM head's logits take it; fp32 inputs the same as without it."""
    x, w, b = inputs(M, 37, 300, torch.bfloat16, bias, seed=11)
    y = gemv_triton(x, w, b, out_dtype=torch.float32)
    assert y.dtype == torch.float32
    assert torch.equal(y.cpu(), gemv_triton(x, w, b).float().cpu())
    x, w, b = inputs(M, 37, 300, torch.float32, bias, seed=12)
    assert torch.equal(gemv_triton(x, w, b, out_dtype=torch.float32).cpu(), gemv_triton(x, w, b).cpu())
    assert torch.equal(gemv_triton(x[:, :0], w[:, :0], b, out_dtype=torch.float32).cpu(),
                       torch.zeros(M, 37) if b is None else b[None].expand(M, 37).cpu())


def test_typed_errors():
    x, w, b = inputs(MAX_ROWS + 1, 8, 16, torch.float32, True)
    with pytest.raises(ValueError, match="at most"):
        gemv_triton(x, w)
    with pytest.raises(ValueError, match=r"\[M, K\] and \[N, K\]"):
        gemv_triton(x[:1], w[:, :8])
    with pytest.raises(ValueError, match="bias"):
        gemv_triton(x[:1], w, b[:4])
    with pytest.raises(ValueError, match="out_dtype"):
        gemv_triton(x[:1], w, b, out_dtype=torch.float16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,M,N,K", [(3, 1, 37, 300), (2, 4, 70, 40), (5, 3, 9, 129)])
@pytest.mark.parametrize("columns_major", [False, True])
def test_batched_rows_match_each_product(B, M, N, K, dtype, columns_major):
    """`bmm_rows_triton`: each batch entry's product x[b] @ w[b].T, for a weight with unit-stride rows and for a
    transposed view of a [B, K, N] tensor (unit-stride columns, as MLA's absorbed key weight is read), x a
    view with strides of its own; the same values as the entry's `gemv_triton` within rounding."""
    g = torch.Generator().manual_seed(B * 100 + N)
    x = torch.randn(M, B, K + 5, generator=g).to(dtype).to(DEVICE).transpose(0, 1)[..., :K]  # [B, M, K] strided
    w = (torch.randn(B, K, N, generator=g) / K ** 0.5).to(dtype).to(DEVICE)
    w = w.transpose(1, 2) if columns_major else w.transpose(1, 2).contiguous()
    assert (w.stride(1) == 1) == columns_major
    y = bmm_rows_triton(x, w)
    assert y.shape == (B, M, N) and y.dtype == dtype
    atol, rtol = TOL[dtype]
    for b in range(B):
        torch.testing.assert_close(y[b].cpu(), reference(x[b], w[b], None).cpu(), atol=atol, rtol=rtol)


def test_batched_rows_typed_errors_and_empty_shapes():
    x, w = torch.randn(2, 1, 16, device=DEVICE), torch.randn(2, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="at most"):
        bmm_rows_triton(torch.randn(2, MAX_ROWS + 1, 16, device=DEVICE), w)
    with pytest.raises(ValueError, match=r"\[B, M, K\] and \[B, N, K\]"):
        bmm_rows_triton(x, w[:1])
    with pytest.raises(ValueError, match=r"\[B, M, K\] and \[B, N, K\]"):
        bmm_rows_triton(x, w[..., :8])
    assert bmm_rows_triton(x[:, :0], w).shape == (2, 0, 8)
    assert torch.equal(bmm_rows_triton(x[..., :0], w[..., :0]).cpu(), torch.zeros(2, 1, 8))


def test_linear_takes_it_up_to_gemv_rows(monkeypatch):
    """`ops.linear.linear` sends 1 to GEMV_ROWS rows to the kernel where Triton runs (the values of the product
    within rounding; by default one row) and more rows, or none while GEMV_ROWS is 0, to F.linear."""
    calls = record_calls(monkeypatch, gemv_module, "gemv_triton")
    x, w, b = inputs(3, 16, 32, torch.float32, True, seed=7)
    with kernels_on_cpu() if DEVICE == "cpu" else torch.no_grad():
        assert linear_op.GEMV_ROWS == 1
        linear_op.linear(x[:1], w, b)
        linear_op.linear(x[:2], w, b)
        assert calls == ["gemv_triton"]
        calls.clear()
        monkeypatch.setattr(linear_op, "GEMV_ROWS", 0)
        linear_op.linear(x[:1], w, b)
        assert calls == []
        monkeypatch.setattr(linear_op, "GEMV_ROWS", 2)
        y2 = linear_op.linear(x[:2], w, b)
        assert calls == ["gemv_triton"]
        linear_op.linear(x, w, b)  # 3 rows: F.linear
        assert calls == ["gemv_triton"]
    torch.testing.assert_close(y2.cpu(), reference(x[:2], w, b).cpu(), atol=1e-5, rtol=1e-5)


def test_linear_widens_to_float32_on_either_path(monkeypatch):
    """`linear(..., out_dtype=torch.float32)` (the LM head's logits): on the gemv and on F.linear, the bf16
    result as float32, bit for bit `.float()` of the same path's bf16 result."""
    x, w, b = inputs(1, 16, 32, torch.bfloat16, True, seed=9)
    with kernels_on_cpu() if DEVICE == "cpu" else torch.no_grad():
        for rows in (1, 0):  # the gemv, then F.linear
            monkeypatch.setattr(linear_op, "GEMV_ROWS", rows)
            y = linear_op.linear(x, w, b, out_dtype=torch.float32)
            assert y.dtype == torch.float32 and torch.equal(y, linear_op.linear(x, w, b).float()), rows
