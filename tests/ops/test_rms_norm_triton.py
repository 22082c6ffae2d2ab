"""The fused Triton RMSNorms against the modules' own torch forwards (`models/layers/norm.py`).

Each test builds the module, runs its forward with the dispatch forced to torch (the reference) and then to
Triton (`norm.runs_triton` patched; a spy checks the kernel ran), on the same inputs. Runs on CUDA, or on
CPU tensors in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where there is no CUDA
device); skipped otherwise.
Tolerances. fp32: rtol 2e-6, atol 1e-7 (the same fp32 steps, but the sum of squares in another order and
rsqrt / exp as each backend computes them; 4e-7 at most in the interpreter; on the GPU Triton's exp is
exp2-based, whose error grows with |gate|). bf16 and fp16: every element within one ulp of the reference,
and at most 0.1% of elements off at all: the kernel rounds where torch does, so only an fp32-level
difference that lands on a rounding boundary flips a bit (in the interpreter none in the small cases,
0-3 of 2.6e5 bf16 elements in `test_many_rows`); a wrong or missing rounding step is off in far more.
"""
import pytest
import torch

from hybridcache.ops.triton_support import triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.models.layers import norm  # noqa: E402
from hybridcache.ops import rms_norm_triton  # noqa: E402

N, H, D = 6, 3, 48  # tokens, heads, channels a row (not a power of two: the 64-wide tile is masked)
BF16 = torch.bfloat16
F16 = torch.float16
F32 = torch.float32


@pytest.fixture
def both(monkeypatch):
    """forward(module, *inputs) -> (torch reference, Triton result) of the module's own `forward`."""
    launches = []
    launch = rms_norm_triton._launch

    def spy(*args, **kw):
        launches.append(args[0])
        return launch(*args, **kw)

    monkeypatch.setattr(rms_norm_triton, "_launch", spy)

    def forward(module: torch.nn.Module, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        monkeypatch.setattr(norm, "runs_triton", lambda t: False)
        ref = module(*inputs)
        assert not launches
        monkeypatch.setattr(norm, "runs_triton", lambda t: True)
        out = module(*inputs)
        assert len(launches) == 1, "the forward did not take the Triton path"
        launches.clear()
        assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
        return ref, out

    return forward


def _ordinal(t: torch.Tensor) -> torch.Tensor:
    """16-bit floats as integers in value order (adjacent representable values differ by 1; -0 == +0)."""
    i = t.view(torch.int16).int()
    return torch.where(i < 0, -(i & 0x7FFF), i)


def assert_matches(ref: torch.Tensor, out: torch.Tensor) -> None:
    if ref.dtype == F32:
        torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-7)
        return
    ulps = (_ordinal(out) - _ordinal(ref)).abs()
    assert ulps.max() <= 1, f"{int((ulps > 1).sum())} elements over one ulp apart"
    # fp16 keeps 3 more mantissa bits than bf16, so the fused path's differently ordered fp32 sum lands on the
    # other side of a rounding boundary now and then: 1 of 864 elements on the H200
    allowed = max(2, int(1e-3 * ulps.numel()))
    assert int((ulps > 0).sum()) <= allowed, f"{int((ulps > 0).sum())} of {ulps.numel()} elements differ"


def weights(module: norm.WeightedNorm, centre: float, seed: int) -> norm.WeightedNorm:
    g = torch.Generator().manual_seed(seed)
    w = module.weight
    w.copy_((centre + 0.5 * torch.randn(w.shape, generator=g)).to(w.dtype))
    return module


def randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(device=DEVICE, dtype=dtype)


def rms_input(layout: str, dtype: torch.dtype) -> torch.Tensor:
    if layout == "slice":  # columns 16:64 of a wider row, as a split of a projection
        return randn(N, D + 32, dtype=dtype, seed=1)[:, 16:16 + D]
    if layout == "heads":  # q of `q_proj(x).view(n, H, 2 * dh).split(dh, -1)`: rows 2·dh apart
        return randn(N, H, 2 * D, dtype=dtype, seed=1).split(D, dim=-1)[0]
    if layout == "transposed":  # no unit last stride: copied
        return randn(D, N, dtype=dtype, seed=1).t()
    return randn(D, dtype=dtype, seed=1)  # "vector": one row


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("zero_centred", [False, True], ids=["w", "1+w"])
@pytest.mark.parametrize("layout", ["slice", "heads", "transposed", "vector"])
def test_rms_norm(both, layout: str, zero_centred: bool, dtype: torch.dtype) -> None:
    module = weights(norm.RMSNorm(D, 1e-6, DEVICE, dtype, zero_centred=zero_centred), 0.0 if zero_centred else 1.0, 0)
    assert_matches(*both(module, rms_input(layout, dtype)))


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("zero_centred", [False, True], ids=["w", "1+w"])
@pytest.mark.parametrize("layout", ["slice", "heads", "vector"])
def test_residual_add_and_norm(monkeypatch, layout: str, zero_centred: bool, dtype: torch.dtype) -> None:
    """`RMSNorm.add(x, delta)`: the sum is exactly torch's `x + delta` in x's dtype (the residual stream goes
    on bit for bit), the norm of it as `forward`'s; one launch. Deltas of another layout than x's."""
    module = weights(norm.RMSNorm(D, 1e-6, DEVICE, dtype, zero_centred), 0.0 if zero_centred else 1.0, seed=4)
    x = rms_input(layout, dtype)
    delta = randn(*x.shape, dtype=dtype, seed=9, scale=3.0)
    launches = []
    launch = rms_norm_triton._launch
    monkeypatch.setattr(rms_norm_triton, "_launch", lambda *a, **kw: launches.append(a[0]) or launch(*a, **kw))
    monkeypatch.setattr(norm, "runs_triton", lambda t: False)
    ref, ref_sum = module.add(x, delta)
    assert torch.equal(ref_sum, x + delta) and not launches
    monkeypatch.setattr(norm, "runs_triton", lambda t: True)
    out, summed = module.add(x, delta)
    assert len(launches) == 1
    assert summed.dtype == dtype and summed.shape == x.shape and torch.equal(summed, ref_sum)
    assert out.dtype == dtype and out.shape == x.shape
    assert_matches(ref, out)
    out_none, same = module.add(x, None)  # nothing to add: the plain norm, the stream as it was
    assert same is x and torch.equal(out_none, module(x))


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("groups", [1, 4])
def test_gated_group_rms_norm(both, groups: int, dtype: torch.dtype) -> None:
    """y [N, I] contiguous (the scan's output), z a column slice of the in_proj output; D = 48 a group."""
    inner = 4 * D
    module = weights(norm.GatedGroupRMSNorm(inner, groups, 1e-5, DEVICE, dtype), 1.0, 0)
    y = randn(N, inner, dtype=dtype, seed=1)
    z = randn(N, 2 * inner + 5, dtype=dtype, seed=2, scale=2.0)[:, :inner]  # z, xBC, dt = in_proj(x).split(...)
    assert_matches(*both(module, y, z))


GATED = {"silu": norm.GatedRMSNorm, "sigmoid": norm.SigmoidGatedRMSNorm}


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("kind", GATED)
def test_per_head_gated_norms(both, kind: str, strided: bool, dtype: torch.dtype) -> None:
    """GDN's GatedRMSNorm and KDA's SigmoidGatedRMSNorm per value head: [N, H, V] in, the gate a head view of a
    column slice of a wider projection (rows H·V + 7 apart); strided: the input a slice too."""
    module = weights(GATED[kind](D, 1e-6, DEVICE, dtype), 1.0, 0)
    if strided:
        x = randn(N, H * D + 9, dtype=dtype, seed=1)[:, 9:].view(N, H, D)
    else:
        x = randn(N, H, D, dtype=dtype, seed=1)
    gate = randn(N, H * D + 7, dtype=dtype, seed=2, scale=2.0)[:, :H * D].view(N, H, D)
    assert_matches(*both(module, x, gate))


@pytest.mark.parametrize("kind", ["rms", "group", "silu", "sigmoid"])
def test_fp32_weights_with_bf16_activations(both, kind: str) -> None:
    """Weights kept in fp32: torch promotes each weighted product (and the group norm's output) to fp32."""
    x = randn(N, H, D, dtype=BF16, seed=1)
    gate = randn(N, H, D, dtype=BF16, seed=2, scale=2.0)
    if kind == "rms":
        module, inputs = norm.RMSNorm(D, 1e-6, DEVICE, F32), (x,)
    elif kind == "group":
        module, inputs = norm.GatedGroupRMSNorm(H * D, H, 1e-5, DEVICE, F32), (x.view(N, -1), gate.view(N, -1))
    else:
        module, inputs = GATED[kind](D, 1e-6, DEVICE, F32), (x, gate)
    ref, out = both(weights(module, 1.0, 0), *inputs)
    assert out.dtype == (F32 if kind == "group" else BF16)
    assert_matches(ref, out)


@pytest.mark.parametrize("kind", ["rms", "group", "silu", "sigmoid"])
def test_many_rows(both, kind: str) -> None:
    """bf16, 2048 rows of 128 (heads, or the group norm's 4 groups of 512 channels): enough elements that
    a few land on rounding boundaries."""
    x = randn(512, 4, 128, dtype=BF16, seed=3)
    gate = randn(512, 4, 128, dtype=BF16, seed=4, scale=2.0)
    if kind == "rms":
        module, inputs = norm.RMSNorm(128, 1e-6, DEVICE, BF16), (x,)
    elif kind == "group":
        module, inputs = norm.GatedGroupRMSNorm(512, 4, 1e-5, DEVICE, BF16), (x.view(512, -1), gate.view(512, -1))
    else:
        module, inputs = GATED[kind](128, 1e-6, DEVICE, BF16), (x, gate)
    assert_matches(*both(weights(module, 1.0, 5), *inputs))


def test_one_wide_row_a_program(both) -> None:
    """A hidden-size row (2000 channels: a 2048-wide tile, one row a program) over a few tokens."""
    module = weights(norm.RMSNorm(2000, 1e-6, DEVICE, BF16), 1.0, 0)
    assert_matches(*both(module, randn(3, 2000, dtype=BF16, seed=1)))


@pytest.mark.parametrize("layout", ["slice", "heads"])
def test_strided_rows_are_read_in_place(layout: str) -> None:
    """A column slice, and heads of one, fold into [M, G, D] rows without a copy."""
    x = rms_input(layout, BF16)
    assert rms_norm_triton._rows(x).data_ptr() == x.data_ptr()


def test_no_rows() -> None:
    weight = torch.ones(D, device=DEVICE)
    out = rms_norm_triton.rms_norm_triton(torch.empty(0, D, device=DEVICE), weight, 1e-6)
    assert out.shape == (0, D)
