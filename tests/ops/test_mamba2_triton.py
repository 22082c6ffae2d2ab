"""Triton Mamba2 decode vs the naive reference and the torch path: outputs, the written state, and every
state entry no listed slot owns, bit for bit. Then the same kernel over T tokens with per-token states
(`mamba2_verify_intermediate_triton`) vs the torch `mamba2_verify_intermediate` and T naive decode steps:
outputs, every inter[slot, t], ssm left alone, and the state `mamba2_accept_intermediate` copies back.

Runs on CUDA, or on CPU tensors in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 when
there is no CUDA device); skipped when triton does not import or neither applies.
Tolerances: fp32 outputs and states 1e-5 abs / 1e-5 rel (same fp32 arithmetic, differing only in the
order of the N-sum and in exp / softplus roundings); bf16 outputs 1e-2 / 1e-2 (one bf16 rounding of an
fp32 result apart), bf16-input states still 1e-5 (the state stays fp32). The intermediate states hold
the same tolerances against the torch path's closed form (exp of cumsum differences, not T products).
"""

from __future__ import annotations

import pytest
import torch

from hybridcache.ops.mamba2.common import NO_LIMIT
from hybridcache.ops.mamba2.decode import mamba2_decode_torch
from hybridcache.ops.mamba2.intermediate import mamba2_accept_intermediate, mamba2_verify_intermediate_torch
from hybridcache.ops.mamba2.naive import mamba2_decode_ref
from hybridcache.ops.triton_support import triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops.mamba2.triton_decode import (  # noqa: E402
    default_block_p,
    mamba2_decode_triton,
    mamba2_verify_intermediate_triton,
)

OUT_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}
STATE_TOL = dict(atol=1e-5, rtol=1e-5)
SLOTS = [4, -1, 1, 3]  # out of order, one padding row; slots 0, 2 and 5 are unused
NUM_SLOTS, LAYERS, LAYER = 6, 2, 1


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN == NaN)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def make_pool(heads: int, head_dim: int, dstate: int, slots: list[int], seed: int = 0) -> torch.Tensor:
    """[S, L, H, P, N] fp32, NaN except the layer's listed slots; the layer's ssm is `pool[:, LAYER]`."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.full((NUM_SLOTS, LAYERS, heads, head_dim, dstate), float("nan"))
    for s in slots:
        if s >= 0:
            pool[s, LAYER] = torch.randn(heads, head_dim, dstate, generator=g)
    return pool


def make_inputs(batch: int, heads: int, head_dim: int, groups: int, dstate: int, dtype: torch.dtype, seed: int = 1,
                steps: int | None = None):
    """x, dt, B, C as strided views of one [B, (T,) H*P + 2*G*N + H] projection, as the mixer splits it."""
    g = torch.Generator().manual_seed(seed)
    inner, gn = heads * head_dim, groups * dstate
    lead = (batch,) if steps is None else (batch, steps)
    proj = torch.randn(*lead, inner + 2 * gn + heads, generator=g).to(dtype)
    x, B, C, dt = proj.split([inner, gn, gn, heads], dim=-1)
    return (x.unflatten(-1, (heads, head_dim)), dt, B.unflatten(-1, (groups, dstate)),
            C.unflatten(-1, (groups, dstate)))


def make_params(heads: int, with_D: bool, with_bias: bool, seed: int = 2) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        A=-torch.exp(torch.rand(heads, generator=g) * 2 - 1),
        D=torch.randn(heads, generator=g) if with_D else None,
        dt_bias=torch.rand(heads, generator=g) - 2.0 if with_bias else None,
    )


def on(device: str, tensors: dict) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in tensors.items()}


def run_case(heads: int, head_dim: int, groups: int, dstate: int, dtype: torch.dtype, with_D: bool = True,
             with_bias: bool = True, dt_limit=NO_LIMIT, slots=SLOTS, block_p: int | None = None) -> None:
    pool = make_pool(heads, head_dim, dstate, slots)
    x, dt, B, C = make_inputs(len(slots), heads, head_dim, groups, dstate, dtype)
    kw = make_params(heads, with_D, with_bias) | dict(dt_limit=dt_limit)
    slot_t = torch.tensor(slots)

    pool_ref, pool_torch = pool.clone(), pool.clone()
    y_ref = mamba2_decode_ref(x, dt, kw["A"], B, C, pool_ref[:, LAYER], slot_t, kw["D"], kw["dt_bias"], dt_limit)
    y_torch = mamba2_decode_torch(x, dt, kw["A"], B, C, pool_torch[:, LAYER], slot_t, kw["D"], kw["dt_bias"], dt_limit)

    pool_dev = pool.to(DEVICE, copy=True)  # a copy even on the CPU: `pool` stays the before-image
    dev = on(DEVICE, dict(x=x, dt=dt, B=B, C=C, slots=slot_t) | kw)
    y = mamba2_decode_triton(dev["x"], dev["dt"], dev["A"], dev["B"], dev["C"], pool_dev[:, LAYER], dev["slots"],
                             dev["D"], dev["dt_bias"], dt_limit, block_p=block_p).cpu()
    got = pool_dev.cpu()

    assert y.dtype == dtype and y.shape == x.shape and torch.isfinite(y).all()
    torch.testing.assert_close(y, y_ref, **OUT_TOL[dtype])
    torch.testing.assert_close(y, y_torch, **OUT_TOL[dtype])
    live = [s for s in slots if s >= 0]
    torch.testing.assert_close(got[live, LAYER], pool_ref[live, LAYER], **STATE_TOL)
    torch.testing.assert_close(got[live, LAYER], pool_torch[live, LAYER], **STATE_TOL)
    untouched = torch.ones(NUM_SLOTS, LAYERS, dtype=torch.bool)
    untouched[live, LAYER] = False
    assert same_bits(got[untouched], pool[untouched])  # other slots and the other layer: NaN as they were


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("with_D", [True, False], ids=["D", "noD"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dt_limit", [NO_LIMIT, (0.05, 0.5)], ids=["nolimit", "limit"])
def test_matches_reference_and_torch(dtype, groups: int, with_D: bool, with_bias: bool, dt_limit) -> None:
    run_case(4, 8, groups, 16, dtype, with_D, with_bias, dt_limit)


@pytest.mark.parametrize("block_p", [2, 4, 8, 16])
def test_block_p_does_not_change_the_result(block_p: int) -> None:
    """Odd sizes pad the tile: P = 6 over 1..3 blocks, N = 12 in a 16-lane tile; H = 6 heads in G = 3 groups."""
    run_case(6, 6, 3, 12, torch.float32, block_p=block_p)


def test_all_padding_writes_nothing() -> None:
    run_case(4, 8, 2, 16, torch.float32, slots=[-1, -1])


def test_large_and_small_dt_through_softplus() -> None:
    """softplus far in both tails (raw dt from -30 to 30): exact to fp32 rounding, never inf or NaN."""
    heads = 4
    pool = make_pool(heads, 4, 8, [0, 1])
    x, _, B, C = make_inputs(2, heads, 4, 1, 8, torch.float32)
    dt = torch.tensor([[-30.0, -8.0, 0.0, 8.0], [15.0, 19.5, 20.5, 30.0]])
    kw = make_params(heads, True, False)
    slots = torch.tensor([0, 1])
    ref = pool.clone()
    y_ref = mamba2_decode_ref(x, dt, kw["A"], B, C, ref[:, LAYER], slots, kw["D"])
    pool_dev = pool.to(DEVICE, copy=True)  # a copy even on the CPU: `pool` stays the before-image
    dev = on(DEVICE, dict(x=x, dt=dt, B=B, C=C, slots=slots) | kw)
    y = mamba2_decode_triton(dev["x"], dev["dt"], dev["A"], dev["B"], dev["C"], pool_dev[:, LAYER], dev["slots"],
                             dev["D"])
    torch.testing.assert_close(y.cpu(), y_ref, **STATE_TOL)
    torch.testing.assert_close(pool_dev.cpu()[[0, 1], LAYER], ref[[0, 1], LAYER], **STATE_TOL)


def test_default_block_p_fills_the_gpu() -> None:
    """H = 64, P = 64, N = 128 on 132 SMs: at least two programs per SM from B = 1, tiles of 1-2K entries."""
    for batch in (1, 2, 8, 64):
        block_p = default_block_p(batch, 64, 64, 128, 132)
        assert batch * 64 * (64 // block_p) >= 2 * 132
        assert 8 <= block_p <= 16


@pytest.mark.skipif(DEVICE != "cuda", reason="dispatch and sync checks need CUDA")
def test_decode_dispatches_to_triton_without_host_sync() -> None:
    from hybridcache.ops.mamba2 import mamba2_decode

    heads, head_dim, groups, dstate = 8, 64, 2, 128
    pool = make_pool(heads, head_dim, dstate, SLOTS).cuda()
    x, dt, B, C = (t.cuda() for t in make_inputs(len(SLOTS), heads, head_dim, groups, dstate, torch.bfloat16))
    kw = on("cuda", make_params(heads, True, True))
    slots = torch.tensor(SLOTS, device="cuda")
    args = (x, dt, kw["A"], B, C)
    want_pool = pool.clone()
    want = mamba2_decode_torch(*args, want_pool[:, LAYER], slots, kw["D"], kw["dt_bias"], (0.0, 1.0))
    mamba2_decode_triton(*args, pool.clone()[:, LAYER], slots, kw["D"], kw["dt_bias"], (0.0, 1.0))  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = mamba2_decode(*args, pool[:, LAYER], slots, kw["D"], kw["dt_bias"], (0.0, 1.0))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got, want, **OUT_TOL[torch.bfloat16])
    live = [s for s in SLOTS if s >= 0]
    torch.testing.assert_close(pool[live, LAYER], want_pool[live, LAYER], **STATE_TOL)


# --- T tokens with per-token states: the intermediate (vLLM / SGLang) verify ---------------------------------


def make_inter_pool(steps: int, heads: int, head_dim: int, dstate: int) -> torch.Tensor:
    """[S, L, T + 1, H, P, N] fp32 NaN: the layer's inter is `pool[:, LAYER]`, one step longer than T (unwritten)."""
    return torch.full((NUM_SLOTS, LAYERS, steps + 1, heads, head_dim, dstate), float("nan"))


def run_inter_case(heads: int, head_dim: int, groups: int, dstate: int, dtype: torch.dtype, steps: int,
                   with_D: bool = True, with_bias: bool = True, dt_limit=NO_LIMIT, slots=SLOTS,
                   block_p: int | None = None) -> None:
    pool = make_pool(heads, head_dim, dstate, slots)
    inter_pool = make_inter_pool(steps, heads, head_dim, dstate)
    x, dt, B, C = make_inputs(len(slots), heads, head_dim, groups, dstate, dtype, steps=steps)
    kw = make_params(heads, with_D, with_bias) | dict(dt_limit=dt_limit)
    slot_t = torch.tensor(slots)
    rows = [i for i, s in enumerate(slots) if s >= 0]
    live = [slots[i] for i in rows]
    num_valid = torch.arange(len(slots)) % steps + 1  # every accept count 1..T among the rows

    pool_torch, inter_torch = pool.clone(), inter_pool.clone()
    y_torch = mamba2_verify_intermediate_torch(x, dt, kw["A"], B, C, pool_torch[:, LAYER], inter_torch[:, LAYER],
                                               slot_t, kw["D"], kw["dt_bias"], dt_limit)
    # the naive reference, T decode steps one after another (the recurrence the kernel runs); a padding row
    # restarts from zeros at each step there, so only the live rows compare
    pool_ref, y_ref, states_ref = pool.clone(), [], []
    for t in range(steps):
        y_ref.append(mamba2_decode_ref(x[:, t], dt[:, t], kw["A"], B[:, t], C[:, t], pool_ref[:, LAYER], slot_t,
                                       kw["D"], kw["dt_bias"], dt_limit))
        states_ref.append(pool_ref[live, LAYER].clone())

    pool_dev, inter_dev = pool.to(DEVICE, copy=True), inter_pool.to(DEVICE, copy=True)
    dev = on(DEVICE, dict(x=x, dt=dt, B=B, C=C, slots=slot_t, num_valid=num_valid) | kw)
    y = mamba2_verify_intermediate_triton(dev["x"], dev["dt"], dev["A"], dev["B"], dev["C"], pool_dev[:, LAYER],
                                          inter_dev[:, LAYER], dev["slots"], dev["D"], dev["dt_bias"], dt_limit,
                                          block_p=block_p).cpu()
    got_inter = inter_dev.cpu()

    assert y.dtype == dtype and y.shape == x.shape and torch.isfinite(y).all()
    torch.testing.assert_close(y, y_torch, **OUT_TOL[dtype])
    torch.testing.assert_close(y[rows], torch.stack(y_ref, 1)[rows], **OUT_TOL[dtype])
    assert same_bits(pool_dev.cpu(), pool)  # ssm is read only
    for t in range(steps):
        torch.testing.assert_close(got_inter[live, LAYER, t], inter_torch[live, LAYER, t], **STATE_TOL)
        torch.testing.assert_close(got_inter[live, LAYER, t], states_ref[t], **STATE_TOL)
    untouched = torch.ones(NUM_SLOTS, LAYERS, steps + 1, dtype=torch.bool)
    untouched[live, LAYER, :steps] = False
    assert same_bits(got_inter[untouched], inter_pool[untouched])  # padding, other slots / layer, step T: NaN

    mamba2_accept_intermediate(pool_torch[:, LAYER], inter_torch[:, LAYER], slot_t, num_valid)
    mamba2_accept_intermediate(pool_dev[:, LAYER], inter_dev[:, LAYER], dev["slots"], dev["num_valid"])
    got = pool_dev.cpu()
    torch.testing.assert_close(got[live, LAYER], pool_torch[live, LAYER], **STATE_TOL)
    assert same_bits(got[live, LAYER], got_inter[live, LAYER, num_valid[rows] - 1])
    untouched = torch.ones(NUM_SLOTS, LAYERS, dtype=torch.bool)
    untouched[live, LAYER] = False
    assert same_bits(got[untouched], pool[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("steps", [1, 3])
def test_intermediate_matches_torch_and_reference(steps: int, groups: int, dtype) -> None:
    run_inter_case(4, 8, groups, 16, dtype, steps)


def test_intermediate_without_D_and_bias_with_dt_limit() -> None:
    run_inter_case(4, 8, 2, 16, torch.float32, 3, with_D=False, with_bias=False, dt_limit=(0.05, 0.5))


@pytest.mark.parametrize("block_p", [2, 8])
def test_intermediate_odd_sizes_any_block_p(block_p: int) -> None:
    """P = 6 over 1 or 3 blocks, N = 12 in a 16-lane tile; H = 6 heads in G = 3 groups."""
    run_inter_case(6, 6, 3, 12, torch.float32, 3, block_p=block_p)


def test_intermediate_all_padding_writes_nothing() -> None:
    run_inter_case(4, 8, 2, 16, torch.float32, 3, slots=[-1, -1])


def test_intermediate_rejects_short_or_non_fp32_inter() -> None:
    pool = make_pool(4, 8, 16, SLOTS)
    x, dt, B, C = make_inputs(len(SLOTS), 4, 8, 2, 16, torch.float32, steps=3)
    A, slots = make_params(4, False, False)["A"], torch.tensor(SLOTS)
    short = torch.zeros(NUM_SLOTS, 2, 4, 8, 16)
    with pytest.raises(ValueError, match="inter must be"):
        mamba2_verify_intermediate_triton(x, dt, A, B, C, pool[:, LAYER], short, slots)
    with pytest.raises(ValueError, match="inter must be float32"):
        mamba2_verify_intermediate_triton(x, dt, A, B, C, pool[:, LAYER], short.double(), slots)


@pytest.mark.skipif(DEVICE != "cuda", reason="dispatch and sync checks need CUDA")
def test_verify_intermediate_dispatches_to_triton_without_host_sync() -> None:
    from hybridcache.ops.mamba2.intermediate import mamba2_verify_intermediate

    heads, head_dim, groups, dstate, steps = 8, 64, 2, 128, 4
    pool = make_pool(heads, head_dim, dstate, SLOTS).cuda()
    inter = make_inter_pool(steps, heads, head_dim, dstate).cuda()
    x, dt, B, C = (t.cuda() for t in make_inputs(len(SLOTS), heads, head_dim, groups, dstate, torch.bfloat16,
                                                 steps=steps))
    kw = on("cuda", make_params(heads, True, True))
    slots = torch.tensor(SLOTS, device="cuda")
    args = (x, dt, kw["A"], B, C, pool[:, LAYER])
    want_inter = inter.clone()
    want = mamba2_verify_intermediate_torch(*args, want_inter[:, LAYER], slots, kw["D"], kw["dt_bias"], (0.0, 1.0))
    mamba2_verify_intermediate_triton(*args, inter.clone()[:, LAYER], slots, kw["D"], kw["dt_bias"], (0.0, 1.0))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = mamba2_verify_intermediate(*args, inter[:, LAYER], slots, kw["D"], kw["dt_bias"], (0.0, 1.0))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got, want, **OUT_TOL[torch.bfloat16])
    live = [s for s in SLOTS if s >= 0]
    torch.testing.assert_close(inter[live, LAYER, :steps], want_inter[live, LAYER, :steps], **STATE_TOL)
