"""Triton causal conv1d (update and varlen prefill) vs the naive reference and the torch path: outputs,
the written conv windows, and every pool entry no listed slot owns, bit for bit.

Runs on CUDA, or on CPU tensors in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 when
there is no CUDA device); skipped when triton does not import or neither applies.
Tolerances: fp32 outputs 1e-5 abs / 1e-5 rel (K fp32 products summed in another order, silu's exp);
bf16 outputs 1e-2 / 1e-2 (one bf16 rounding of an fp32 result apart). The written windows are the inputs
converted to the role's dtype: bit for bit equal, in both dtypes.
"""

from __future__ import annotations

import pytest
import torch

from hybridcache.ops.conv1d.fast import causal_conv1d_prefill_torch, causal_conv1d_update_torch
from hybridcache.ops.conv1d.naive import causal_conv1d_prefill_ref, causal_conv1d_update_ref
from hybridcache.ops.triton_support import triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops.conv1d.triton_conv import causal_conv1d_prefill_triton, causal_conv1d_update_triton  # noqa: E402

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}
CHANNELS = 40  # two channel blocks of 32 in the interpreter, the second one partly masked
NUM_SLOTS, LAYERS, LAYER = 6, 2, 1


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN == NaN)."""
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


def make_pool(slots: list[int], width: int, role: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """[S, L, C, role] in `dtype`, NaN everywhere except the windows (first W columns) of the layer's slots;
    the layer's conv role is the strided view `pool[:, LAYER]`."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.full((NUM_SLOTS, LAYERS, CHANNELS, role), float("nan"), dtype=dtype)
    for s in slots:
        if s >= 0:
            pool[s, LAYER, :, : width - 1] = torch.randn(CHANNELS, width - 1, generator=g).to(dtype)
    return pool


def make_weights(width: int, with_bias: bool, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """weight [C, K] as the mixers pass it (a view of a [C, 1, K] parameter); bias [C] or None."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(CHANNELS, 1, width, generator=g)[:, 0]
    return weight, torch.randn(CHANNELS, generator=g) if with_bias else None


def strided_tokens(lead: tuple[int, ...], dtype: torch.dtype, seed: int = 2) -> torch.Tensor:
    """[*lead, C] as a column slice of a wider projection (not contiguous)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*lead, CHANNELS + 8, generator=g).to(dtype)[..., 3 : 3 + CHANNELS]


def to_dev(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.to(DEVICE)


def check_pools(got: torch.Tensor, ref: torch.Tensor, torch_path: torch.Tensor, before: torch.Tensor,
                slots: list[int]) -> None:
    """Same bits as the reference and the torch path everywhere; entries of slots not listed (or of the
    other layer) kept theirs."""
    assert same_bits(got, ref) and same_bits(got, torch_path)
    untouched = torch.ones(NUM_SLOTS, LAYERS, dtype=torch.bool)
    untouched[[s for s in slots if s >= 0], LAYER] = False
    assert same_bits(got[untouched], before[untouched])


SLOTS = [4, -1, 1, 3]  # out of order, one padding row; slots 0, 2 and 5 unused


def run_update(steps: int, width: int, extra: int, dtype: torch.dtype, with_bias: bool, activation: str | None,
               slots: list[int] = SLOTS, **kw) -> None:
    pool = make_pool(slots, width, width - 1 + extra, dtype)
    weight, bias = make_weights(width, with_bias)
    x = strided_tokens((len(slots), steps), dtype)
    slot_t = torch.tensor(slots)
    ref, fast = pool.clone(), pool.clone()
    y_ref = causal_conv1d_update_ref(x, weight, bias, ref[:, LAYER], slot_t, activation)
    y_torch = causal_conv1d_update_torch(x, weight, bias, fast[:, LAYER], slot_t, activation)
    dev = pool.to(DEVICE, copy=True)  # a copy even on the CPU: `pool` stays the before-image
    y = causal_conv1d_update_triton(x.to(DEVICE), weight.to(DEVICE), to_dev(bias), dev[:, LAYER], slot_t.to(DEVICE),
                                    activation, **kw).cpu()
    assert y.dtype == dtype and y.shape == x.shape and torch.isfinite(y).all()
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    torch.testing.assert_close(y, y_torch, **TOL[dtype])
    check_pools(dev.cpu(), ref, fast, pool, slots)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_update_matches_reference_and_torch(dtype, steps: int, with_bias: bool, activation) -> None:
    """K = 4 over a role of W + 3 columns: T = 3 writes W + 2 of them, the last stays NaN."""
    run_update(steps, 4, 3, dtype, with_bias, activation)


@pytest.mark.parametrize("width", [1, 2, 5])
@pytest.mark.parametrize("steps", [1, 2])
def test_update_kernel_widths(width: int, steps: int) -> None:
    """K = 1 with T = 1 writes nothing (W + T - 1 = 0); a role exactly as wide as needed."""
    run_update(steps, width, max(1, steps - 1), torch.float32, True, "silu")


@pytest.mark.parametrize("block_c", [16, 64])
def test_update_block_c_does_not_change_the_result(block_c: int) -> None:
    run_update(3, 4, 2, torch.float32, True, "silu", block_c=block_c)


def test_update_all_padding_writes_nothing() -> None:
    run_update(2, 4, 1, torch.float32, True, None, slots=[-1, -1])


def test_update_role_too_narrow_raises() -> None:
    pool = make_pool([0], 4, 4, torch.float32)
    weight, bias = make_weights(4, True)
    with pytest.raises(ValueError, match="T=3 needs a conv role of width >= 5"):
        causal_conv1d_update_triton(strided_tokens((1, 3), torch.float32).to(DEVICE), weight.to(DEVICE), to_dev(bias),
                                    pool[:, LAYER].to(DEVICE), torch.tensor([0], device=DEVICE))


def cu_of(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + lens).cumsum(0)


# rows: empty, one token (shorter than the window), long (several token blocks), a padding row with tokens
PREFILL_LENS = [7, 0, 1, 12, 3, 2]
PREFILL_SLOTS = [4, 1, 0, 3, -1, 2]
PREFILL_INIT = [True, True, True, False, True, True]


def run_prefill(width: int, dtype: torch.dtype, with_bias: bool, activation: str | None, lens=PREFILL_LENS,
                slots=PREFILL_SLOTS, has_initial=PREFILL_INIT, **kw) -> None:
    # slot 5 unused; the windows of slots without has_initial hold NaN: they must not be read
    live = [s if init else -1 for s, init in zip(slots, has_initial)]
    pool = make_pool(live, width, width + 1, dtype)
    weight, bias = make_weights(width, with_bias)
    x = strided_tokens((sum(lens),), dtype)
    idx = (torch.tensor(slots), torch.tensor(has_initial), cu_of(lens))
    ref, fast = pool.clone(), pool.clone()
    y_ref = causal_conv1d_prefill_ref(x, weight, bias, ref[:, LAYER], *idx, activation)
    y_torch = causal_conv1d_prefill_torch(x, weight, bias, fast[:, LAYER], *idx, activation)
    dev = pool.to(DEVICE, copy=True)  # a copy even on the CPU: `pool` stays the before-image
    y = causal_conv1d_prefill_triton(x.to(DEVICE), weight.to(DEVICE), to_dev(bias), dev[:, LAYER],
                                     *(t.to(DEVICE) for t in idx), activation, **kw).cpu()
    assert y.dtype == dtype and y.shape == x.shape and torch.isfinite(y).all()
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    torch.testing.assert_close(y, y_torch, **TOL[dtype])
    check_pools(dev.cpu(), ref, fast, pool, slots)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_prefill_matches_reference_and_torch(dtype, with_bias: bool, activation) -> None:
    run_prefill(4, dtype, with_bias, activation, block_t=8)


@pytest.mark.parametrize("width", [1, 2, 5])
@pytest.mark.parametrize("block_t", [4, 32])
def test_prefill_widths_and_token_blocks(width: int, block_t: int) -> None:
    """Token blocks that straddle rows (4) or hold the whole batch (32); K = 1 leaves the windows alone."""
    run_prefill(width, torch.float32, True, "silu", block_t=block_t)


@pytest.mark.parametrize("lens", [[5], [0, 0], [0, 3, 0]], ids=["one-row", "no-tokens", "empty-ends"])
def test_prefill_edge_batches(lens: list[int]) -> None:
    """One row (no search steps); no tokens at all (only the windows are written: zeros without
    has_initial); empty rows at both ends."""
    slots = [5, 2, 0][: len(lens)]
    init = [True, False, True][: len(lens)]
    run_prefill(4, torch.float32, True, None, lens=lens, slots=slots, has_initial=init, block_t=4)


@pytest.mark.skipif(DEVICE != "cuda", reason="dispatch and sync checks need CUDA")
def test_dispatches_to_triton_without_host_sync() -> None:
    from hybridcache.ops.conv1d import causal_conv1d_prefill, causal_conv1d_update

    dtype = torch.bfloat16
    weight, bias = (t.cuda() for t in make_weights(4, True))
    pool = make_pool(PREFILL_SLOTS, 4, 6, dtype).cuda()
    x = strided_tokens((sum(PREFILL_LENS),), dtype).cuda()
    idx = [t.cuda() for t in (torch.tensor(PREFILL_SLOTS), torch.tensor(PREFILL_INIT), cu_of(PREFILL_LENS))]
    xs = strided_tokens((len(SLOTS), 3), dtype).cuda()
    slots = torch.tensor(SLOTS, device="cuda")
    want_pool = pool.clone()
    want_p = causal_conv1d_prefill_torch(x, weight, bias, want_pool[:, LAYER], *idx, "silu")
    want_u = causal_conv1d_update_torch(xs, weight, bias, want_pool[:, LAYER], slots, "silu")
    scratch = pool.clone()  # compile outside the sync check
    causal_conv1d_prefill_triton(x, weight, bias, scratch[:, LAYER], *idx, "silu")
    causal_conv1d_update_triton(xs, weight, bias, scratch[:, LAYER], slots, "silu")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got_p = causal_conv1d_prefill(x, weight, bias, pool[:, LAYER], *idx, "silu")
        got_u = causal_conv1d_update(xs, weight, bias, pool[:, LAYER], slots, "silu")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got_p, want_p, **TOL[dtype])
    torch.testing.assert_close(got_u, want_u, **TOL[dtype])
    assert same_bits(pool, want_pool)
