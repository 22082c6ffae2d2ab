"""The one-launch slot row kernels (`ops/slot_rows_triton.py`) against the torch forms they replace on
CUDA (`slot_io.take_rows` / `RowScatter`): bit for bit, fp32 and bf16 pools, padding rows, rows without an
initial state, NaN in the slots nobody reads, rows larger than one block; and `read_rows` / `put_rows`
dispatch to them only where they fit. Runs on CUDA, or on CPU tensors in Triton's interpreter."""
from __future__ import annotations

import pytest
import torch

from hybridcache.ops import slot_io
from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable
from tests.ops.dispatch import record_calls

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops.slot_rows_triton import BLOCK, read_rows_triton, rows_fit, write_rows_triton  # noqa: E402

SLOTS = torch.tensor([4, -1, 0, 6, 2])
INITIAL = torch.tensor([True, True, False, True, True])


def pool(dtype: torch.dtype, row: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(8, *row, generator=g).to(dtype)
    p[[1, 3, 5, 7]] = float("nan")  # slots no row reads
    return p


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("row", [(3, 5, 7), (2, BLOCK + 9)])
@pytest.mark.parametrize("initial", [None, INITIAL])
def test_read_rows_equals_the_torch_form(dtype, row, initial):
    src = pool(dtype, row, seed=row[-1])
    valid = (SLOTS >= 0) & (initial if initial is not None else True)
    want = slot_io.take_rows(src, SLOTS, valid).float()
    got = read_rows_triton(src.to(DEVICE), SLOTS.to(DEVICE), None if initial is None else initial.to(DEVICE))
    assert got.dtype == torch.float32 and torch.equal(got.cpu(), want)
    assert not got.isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("row", [(3, 5, 7), (2, BLOCK + 9)])
def test_write_rows_equals_the_torch_form(dtype, row):
    dst = pool(dtype, row, seed=7)
    # values in the pool's dtype: the interpreter rounds fp32 to bf16 by truncation (the GPU: to nearest)
    values = torch.randn(len(SLOTS), *row, generator=torch.Generator().manual_seed(3)).to(dtype)
    valid = torch.tensor([True, True, True, False, True])  # row 3 keeps its slot's content
    want = dst.clone()
    slot_io.RowScatter((SLOTS,), valid).put(want, values)
    got = dst.clone().to(DEVICE)
    write_rows_triton(got, SLOTS.to(DEVICE), values.to(DEVICE), valid.to(DEVICE))
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
    assert torch.equal(got.cpu().view(bits), want.view(bits))
    assert not torch.equal(want.view(bits), dst.view(bits))  # some row was written


def test_an_empty_batch_reads_and_writes_nothing():
    dst = pool(torch.float32, (2, 3), seed=1).to(DEVICE)
    before = dst.clone()
    none = torch.empty(0, dtype=torch.long, device=DEVICE)
    assert read_rows_triton(dst, none).shape == (0, 2, 3)
    write_rows_triton(dst, none, torch.empty(0, 2, 3, device=DEVICE), none.bool())
    assert torch.equal(dst.view(torch.int32), before.view(torch.int32))


def test_the_kernels_take_contiguous_pools_by_slot_only():
    p = torch.zeros(8, 4, 6)
    assert rows_fit(p, SLOTS, torch.zeros(5, 4, 6))
    assert not rows_fit(p[:, :, :3], SLOTS)  # a window of a wider role
    assert not rows_fit(p, SLOTS, torch.zeros(5, 6, 4).transpose(1, 2))
    assert not rows_fit(p, SLOTS, torch.zeros(5, 4, 5))


@pytest.mark.skipif(DEVICE != "cpu", reason="routes CPU tensors through the kernels (the interpreter)")
def test_slot_io_dispatches_to_the_kernels_where_they_fit(monkeypatch):
    import hybridcache.ops.slot_rows_triton as rows

    calls = record_calls(monkeypatch, rows, "read_rows_triton", "write_rows_triton")
    src = pool(torch.float32, (3, 4), seed=2)
    values = torch.randn(5, 3, 4)
    with kernels_on_cpu():
        got = slot_io.read_rows(src, SLOTS, INITIAL)
        slot_io.put_rows(src, (SLOTS,), values, SLOTS >= 0)
        slot_io.put_rows(src[:, :, :2], (SLOTS,), values[:, :, :2], SLOTS >= 0)  # a window: the torch form
    assert calls == ["read_rows_triton", "write_rows_triton"]
    assert torch.equal(got, slot_io.take_rows(pool(torch.float32, (3, 4), seed=2), SLOTS, (SLOTS >= 0) & INITIAL))
