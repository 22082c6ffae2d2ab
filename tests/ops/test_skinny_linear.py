"""The skinny GEMM (`ops/skinny_linear_triton.py`) against torch's GEMM and activations, and `ops/linear.py`'s
dispatch. Runs on CUDA, or on CPU tensors in Triton's interpreter.

Tolerances. fp32: rtol 1e-5, atol 1e-5 (the same products summed in another order). 16-bit: the reference is
the fp32 sum of the exact products of the 16-bit inputs, rounded where the kernel rounds, so the two differ
only where a sum order moves a value across a rounding boundary: at most one bf16 ulp of the largest output
(2^-7 relative), and at most 2% of the elements at all.
"""
import pytest
import torch
import torch.nn.functional as F

from hybridcache.ops import linear as dispatch
from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.ops.skinny_linear_triton import MAX_ROWS, skinny_linear_triton  # noqa: E402

K, N, INNER = 200, 96, 40  # K and N not multiples of the tiles


def operands(M: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] a column slice of a wider tensor (row stride 300), weight [N, K], bias [N]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, 300, generator=g)[:, :K]
    w, b = torch.randn(N, K, generator=g) / K ** 0.5, torch.randn(N, generator=g)
    return x.to(DEVICE, dtype), w.to(DEVICE, dtype), b.to(DEVICE, dtype)


def reference(x, w, b, epilogue: str) -> torch.Tensor:
    """The unfused ops in fp32 on the same inputs, rounded to x's dtype where torch's 16-bit ops round."""
    dtype = x.dtype
    y = F.linear(x.double(), w.double(), None if b is None else b.double()).float().to(dtype)
    if epilogue == "relu2":
        return torch.square(F.relu(y.float())).to(dtype)
    if epilogue == "silu_mul":
        return (F.silu(y[:, :INNER].float()).to(dtype).float() * y[:, INNER : 2 * INNER].float()).to(dtype)
    return y


def assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        return
    diff = (out.float() - ref.float()).abs()
    assert diff.max() <= ref.float().abs().max() * 2 ** -7, f"max diff {diff.max()}"
    assert (diff > 0).float().mean() <= 0.02, f"{(diff > 0).sum()} of {diff.numel()} differ"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS], ids=lambda m: f"M{m}")  # FMA tiles, and tl.dot's at 16
@pytest.mark.parametrize("epilogue", ["none", "relu2", "silu_mul"])
def test_the_kernel_gives_the_gemm_and_its_activation(dtype, rows, epilogue):
    x, w, b = operands(rows, dtype)
    bias = None if epilogue == "silu_mul" else b
    out = skinny_linear_triton(x, w, bias, epilogue, INNER if epilogue == "silu_mul" else None)
    assert_close(out, reference(x, w, bias, epilogue))


@pytest.mark.parametrize("block", [(1, 16, 16), (1, 64, 256), (4, 32, 64)])
def test_the_tiling_changes_only_the_sum_order(block):
    x, w, b = operands(1, torch.float32, seed=1)
    out = skinny_linear_triton(x, w, b, block=block)
    torch.testing.assert_close(out, reference(x, w, b, "none"), rtol=1e-5, atol=1e-5)


def test_an_empty_batch_gives_an_empty_output():
    x, w, _ = operands(1, torch.float32)
    assert skinny_linear_triton(x[:0], w).shape == (0, N)


def test_linear_dispatches_to_the_skinny_kernel_only_where_it_can(monkeypatch):
    x, w, b = operands(4, torch.float32)
    monkeypatch.setattr(dispatch, "SKINNY", True)
    with kernels_on_cpu() if DEVICE == "cpu" else torch.device(DEVICE):
        assert dispatch.takes_skinny(x, w)
        assert not dispatch.takes_skinny(torch.cat([x] * 5), w)  # 20 rows: cuBLAS
        assert not dispatch.takes_skinny(x.double(), w)  # dtypes differ
        assert not dispatch.takes_skinny(x, w.t().contiguous().t())  # no unit last stride
        assert_close(dispatch.linear(x, w, b, "relu2"), reference(x, w, b, "relu2"))
    monkeypatch.setattr(dispatch, "SKINNY", False)
    assert not dispatch.takes_skinny(x, w)


@pytest.mark.parametrize("epilogue", ["none", "relu2", "silu_mul"])
def test_the_torch_path_applies_the_same_epilogue(epilogue, monkeypatch):
    monkeypatch.setattr(dispatch, "SKINNY", False)
    x, w, b = operands(3, torch.float32)
    bias = None if epilogue == "silu_mul" else b
    out = dispatch.linear(x, w, bias, epilogue, INNER if epilogue == "silu_mul" else None)
    torch.testing.assert_close(out, reference(x, w, bias, epilogue), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("batch,steps", [(1, 1), (3, 1), (2, 4), (4, 4)], ids=lambda v: str(v))
@pytest.mark.parametrize("conv_bias", [False, True], ids=["no-bias", "bias"])
def test_the_conv_epilogue_gives_the_conv_update_of_the_gemm_output(dtype, batch, steps, conv_bias):
    """The conv epilogue against `causal_conv1d_update_triton` on the same GEMM output (columns FIRST .. FIRST + C
    of it, a block boundary inside them): the same outputs and windows, bit for bit; the other columns untouched.
    The second batch row is padding (slot -1) where there are two or more."""
    from hybridcache.ops.conv1d.triton_conv import causal_conv1d_update_triton
    from hybridcache.ops.linear import ConvEpilogue

    first, channels, width, slots_total = 24, 48, 4, 6
    x, w, _ = operands(batch * steps, dtype, seed=2)
    g = torch.Generator().manual_seed(3)
    conv_w = (torch.randn(channels, width, generator=g) / 2).to(DEVICE, dtype)
    conv_b = torch.randn(channels, generator=g).to(DEVICE, dtype) if conv_bias else None
    state = torch.randn(slots_total, channels, width - 1 + 3, generator=g).to(DEVICE, dtype)
    slots = torch.tensor([5, -1, 0, 2][:batch], device=DEVICE, dtype=torch.int32)
    block = (1 << (batch * steps - 1).bit_length(), 32, 64)  # BLOCK_N 32: a program boundary inside the conv's columns
    plain = skinny_linear_triton(x, w, block=block)
    before, expected_state = state.clone(), state.clone()
    expected = causal_conv1d_update_triton(plain[:, first:first + channels].reshape(batch, steps, channels), conv_w,
                                           conv_b, expected_state, slots, "silu")
    out = skinny_linear_triton(x, w, block=block, conv=ConvEpilogue(conv_w, conv_b, state, slots, first, True))
    torch.testing.assert_close(out[:, first:first + channels], expected.reshape(batch * steps, channels),
                               rtol=0, atol=0)
    assert torch.equal(out[:, :first], plain[:, :first]) and torch.equal(out[:, first + channels:],
                                                                        plain[:, first + channels:])
    assert torch.equal(state, expected_state)
    untouched = [s for s in range(slots_total) if s not in slots.tolist()]
    assert torch.equal(state[untouched], before[untouched])  # padding writes no window


def test_a_conv_epilogue_outside_the_skinny_kernel_is_refused(monkeypatch):
    from hybridcache.ops.linear import ConvEpilogue

    monkeypatch.setattr(dispatch, "SKINNY", False)
    x, w, _ = operands(1, torch.float32)
    state = torch.zeros(2, 8, 3, device=DEVICE)
    conv = ConvEpilogue(torch.ones(8, 4, device=DEVICE), None, state, torch.tensor([0], device=DEVICE), 0, True)
    with pytest.raises(ValueError, match="skinny"):
        dispatch.linear(x, w, conv=conv)
    assert not state.any()
