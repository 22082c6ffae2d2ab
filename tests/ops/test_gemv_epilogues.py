"""The one-row GEMM's epilogues (`ops/gemv_triton.py`) against the launches they replace, bit for bit: relu² on
the output (`relu2_triton` of the stored product, 1 to 4 rows) and a causal conv update on a column range of one
row's output (`causal_conv1d_update_triton` on the stored product's columns: the outputs, and the conv role
written in place, where every slot but the row's holds NaN). Runs on CUDA, or on CPU tensors in Triton's
interpreter."""
from __future__ import annotations

import pytest
import torch

from hybridcache.ops.triton_support import triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops.activation_triton import relu2_triton  # noqa: E402
from hybridcache.ops.conv1d.triton_conv import causal_conv1d_update_triton  # noqa: E402
from hybridcache.ops.gemv_triton import ConvEpilogue, gemv_triton  # noqa: E402

NAN = float("nan")


def rand(*shape: int, dtype=torch.bfloat16, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def equal(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.cpu(), b.cpu(), atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,bias", [(1, False), (3, True), (4, False)])
def test_relu2_is_the_two_launches(M, bias, dtype):
    x, w = rand(M, 96, dtype=dtype, seed=M), rand(70, 96, dtype=dtype, seed=7, scale=0.2)
    b = rand(70, dtype=dtype, seed=8) if bias else None
    got = gemv_triton(x, w, b, activation="relu2")
    equal(got, relu2_triton(gemv_triton(x, w, b)))
    assert (got == 0).any() and (got > 0).any()  # both sides of the relu


def conv_case(dtype, conv_dtype, bias: bool, start: int, C: int, N: int, slot: int, extra: int = 2):
    """x [1, 64], w [N, 64], a conv of width 4 over columns start .. start + C, its role a strided view
    (layer 1 of a two-layer pool) [6, C, 3 + extra] full of NaN but the row's slot's window."""
    x, w = rand(1, 64, dtype=dtype, seed=1), rand(N, 64, dtype=dtype, seed=2, scale=0.3)
    taps, conv_bias = rand(C, 4, dtype=dtype, seed=3), (rand(C, dtype=dtype, seed=4) if bias else None)
    pool = torch.full((2, 6, C, 3 + extra + 1), NAN, dtype=conv_dtype, device=DEVICE)
    role = pool[1, :, :, : 3 + extra]
    if slot >= 0:
        role[slot, :, :3] = rand(C, 3, dtype=conv_dtype, seed=5)
    return x, w, taps, conv_bias, role, torch.tensor([slot], device=DEVICE)


@pytest.mark.parametrize("dtype,conv_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                              (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("bias,start,C,N,silu", [
    (False, 0, 40, 53, True),  # the conv channels first (GDN, KDA), columns after them plain
    (True, 13, 24, 45, True),  # in the middle, with a bias (Mamba2: z before, dt after)
    (True, 5, 11, 16, False),  # no activation; channels off the program blocks
])
def test_conv_is_the_two_launches(dtype, conv_dtype, bias, start, C, N, silu):
    x, w, taps, conv_bias, role, slots = conv_case(dtype, conv_dtype, bias, start, C, N, slot=4)
    plain_role = role.clone()
    got = gemv_triton(x, w, conv=ConvEpilogue(start, taps, conv_bias, role, slots, silu))
    want = gemv_triton(x, w)
    conv_out = causal_conv1d_update_triton(want[:, None, start:start + C], taps, conv_bias, plain_role, slots,
                                           "silu" if silu else None)
    want[:, start:start + C] = conv_out[:, 0]
    equal(got, want)
    equal(role, plain_role)  # the row's window shifted, every other slot's NaN as it was
    assert not role[4, :, :3].isnan().any() and role[4, :, 3:].isnan().all()


def test_conv_padding_row_reads_a_zero_window_and_writes_nothing():
    x, w, taps, conv_bias, role, slots = conv_case(torch.bfloat16, torch.bfloat16, True, 8, 16, 30, slot=-1)
    before = role.clone()
    got = gemv_triton(x, w, conv=ConvEpilogue(8, taps, conv_bias, role, slots))
    want = gemv_triton(x, w)
    want[:, 8:24] = causal_conv1d_update_triton(want[:, None, 8:24], taps, conv_bias, before.clone(), slots, "silu")[:, 0]
    equal(got, want)
    assert not got.isnan().any()
    equal(role, before)


def test_typed_errors():
    x, w, taps, conv_bias, role, slots = conv_case(torch.bfloat16, torch.bfloat16, False, 0, 8, 16, slot=0)
    with pytest.raises(ValueError, match="activation"):
        gemv_triton(x, w, activation="gelu")
    with pytest.raises(ValueError, match="one row"):
        gemv_triton(torch.cat([x, x]), w, conv=ConvEpilogue(0, taps, None, role, slots))
    with pytest.raises(ValueError, match="outside"):
        gemv_triton(x, w, conv=ConvEpilogue(10, taps, None, role, slots))
    with pytest.raises(ValueError, match="conv role"):
        gemv_triton(x, w, conv=ConvEpilogue(0, taps, None, role[:, :4], slots))
