"""The samplers' argmax (`ops/argmax_triton.py`) against torch.argmax(-1), exactly: rows of widths off the block,
several blocks, [R, T, V] shapes, fp32 and bf16, ties (the first index), NaNs (the first NaN), rows of -inf (0),
strided rows; typed errors; and `ops.argmax.argmax` sending rows to it only where TRITON_ARGMAX is on. Runs on
CUDA, or on CPU tensors in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch

from hybridcache.ops import argmax as argmax_op
from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable
from tests.ops.dispatch import record_calls

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops import argmax_triton as argmax_module  # noqa: E402
from hybridcache.ops.argmax_triton import argmax_triton  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 4096), (1, 4097), (2, 3, 10000)])
def test_matches_torch(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g).to(dtype).to(DEVICE)
    got = argmax_triton(x)
    assert got.dtype == torch.int64 and got.shape == shape[:-1]
    assert torch.equal(got.cpu(), x.cpu().argmax(-1))


def test_ties_nans_and_rows_of_minus_infinity(monkeypatch):
    """Block 64 over 300 columns: the maximum at columns 5, 69 (another lane's first, the next block) and 250 gives
    5; the maximum only in later blocks on lanes with earlier smaller values gives the first; NaNs at 200 and 70
    give 70; a row of -inf gives 0, as torch does."""
    monkeypatch.setattr(argmax_module, "BLOCK", 64)
    x = torch.zeros(4, 300)
    x[0, [5, 69, 250]] = 3.0
    x[1, [130, 131, 299]] = 2.0
    x[1, 2] = 1.0
    x[2, [200, 70]] = float("nan")
    x[2, 3] = 9.0
    x[3] = float("-inf")
    got = argmax_triton(x.to(DEVICE)).cpu()
    assert got.tolist() == [5, 130, 70, 0]
    assert torch.equal(got[[0, 1, 3]], x[[0, 1, 3]].argmax(-1))


def test_strided_rows():
    """Rows that are the first columns of a wider tensor are read in place; a transposed view is copied: both the
    contiguous rows' result."""
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    wide = torch.cat([x, x + 100], dim=1)[:, :40]
    assert not wide.is_contiguous()
    assert torch.equal(argmax_triton(wide).cpu(), x.cpu().argmax(-1))
    assert torch.equal(argmax_triton(x.T.contiguous().T).cpu(), x.cpu().argmax(-1))


def test_empty_and_errors():
    assert argmax_triton(torch.zeros(0, 9, device=DEVICE)).shape == (0,)
    with pytest.raises(ValueError, match="empty last dimension"):
        argmax_triton(torch.zeros(2, 0, device=DEVICE))


def test_argmax_takes_it_where_switched_on(monkeypatch):
    calls = record_calls(monkeypatch, argmax_module, "argmax_triton")
    x = torch.randn(3, 2, 50, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    with kernels_on_cpu() if DEVICE == "cpu" else torch.no_grad():
        assert argmax_op.TRITON_ARGMAX is False
        assert torch.equal(argmax_op.argmax(x), x.argmax(-1)) and calls == []
        monkeypatch.setattr(argmax_op, "TRITON_ARGMAX", True)
        assert torch.equal(argmax_op.argmax(x), x.argmax(-1)) and calls == ["argmax_triton"]
