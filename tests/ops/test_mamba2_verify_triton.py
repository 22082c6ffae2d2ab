"""The fused Triton Mamba2 replay verify against the reference and the torch path.

Runs on CUDA, or on CPU tensors in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where
there is no CUDA device); skipped otherwise. The reference and the torch path run on the CPU. A batch
mixes rows that append (p = 0, small p, p = HIST - T) and rows that fold (p = HIST - T + 1, p = HIST),
a padding row (its outputs are its tokens run from a zero state, as in the reference; it writes nothing)
and slots out of order. Everything a row must not read is NaN: the slot no row owns, each
live slot's history at or past p and its other buffer; the pools are strided views (every role is one
half of a twice larger tensor whose other half is NaN) and x, B, C are views of one packed projection.
Every element a step does not write must stay bit for bit as it was, a non-folding row's checkpoint
included; what it writes must match both the reference and the torch path.
Tolerances: fp32 1e-4 abs / 1e-4 rel on outputs, folded checkpoints, dt and cumsum (the kernel runs the
new tokens recurrently from the folded state, the torch path in closed form against the history, and the
fold sums in another order: observed differences are ~1e-6). bf16 inputs: the fp32 roles the same 1e-4
(fp32 math on the same bf16 values), outputs 1e-2 / 1e-2 (y is rounded to bf16, whose step is 2^-8
relative, so a last-bit difference rounds apart). replay_x and replay_B take the inputs' values: bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from hybridcache.ops.triton_support import triton_testable
from tests.ops.test_mamba2_replay import ROLE_NAMES, _clone, _params, _roles, _verify

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.ops.mamba2 import mamba2_accept, mamba2_verify, replay, replay_state  # noqa: E402
from hybridcache.ops.mamba2 import triton_verify, triton_verify_heads  # noqa: E402
from hybridcache.ops.mamba2.naive import mamba2_verify_ref  # noqa: E402

NAN = float("nan")
SLOTS = [3, 0, -1, 2, 1, 5, 7, 4]  # out of order, one padding row; slot 6 belongs to no row
BUFS = [0, 1, 1, 0, 1, 0, 0, 1]
UNUSED = 6
FP32 = dict(atol=1e-4, rtol=1e-4)
Y_TOL = {torch.float32: FP32, torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}


def _pnat(hist: int, steps: int) -> list[int]:
    """Per slot: p = 0, HIST - T (fits exactly), HIST - T + 1 and HIST (fold), 3, 1, unused, 2."""
    return [0, hist - steps, hist - steps + 1, hist, 3, 1, 0, 2]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits, so that NaN compares equal to itself."""
    return t.contiguous().view({4: torch.int32, 2: torch.int16}[t.element_size()])


def _poison(roles: dict, pnat: list[int], bufs: list[int]) -> None:
    """NaN wherever no row may read: history at or past p, the other buffer, the unused slot."""
    for s, (p, b) in enumerate(zip(pnat, bufs)):
        for name in ("replay_x", "replay_B"):
            roles[name][s, b, p:] = NAN
            roles[name][s, 1 - b] = NAN
        for name in ("replay_dt", "replay_dA_cumsum"):
            roles[name][s, b, :, p:] = NAN
            roles[name][s, 1 - b] = NAN
    for name in ROLE_NAMES:
        roles[name][UNUSED] = NAN


def _written(roles: dict, pnat: list[int], bufs: list[int], slots: list[int], hist: int, steps: int) -> dict:
    """Per role, a mask of the elements a step writes: folded checkpoints and the appended positions."""
    folded = torch.zeros(len(pnat), dtype=torch.bool)  # [S]
    appended = torch.zeros(len(pnat), 2, hist, dtype=torch.bool)  # [S, 2, HIST]
    for s in (s for s in slots if s >= 0):
        folded[s] = pnat[s] + steps > hist
        target, start = (1 - bufs[s], 0) if folded[s] else (bufs[s], pnat[s])
        appended[s, target, start:start + steps] = True
    return dict(
        ssm=folded[:, None, None, None].expand(roles["ssm"].shape),
        replay_x=appended[..., None, None].expand(roles["replay_x"].shape),
        replay_B=appended[..., None, None].expand(roles["replay_B"].shape),
        replay_dt=appended[:, :, None].expand(roles["replay_dt"].shape),
        replay_dA_cumsum=appended[:, :, None].expand(roles["replay_dA_cumsum"].shape),
    )


def _inputs(batch: int, steps: int, heads: int, head_dim: int, groups: int, dstate: int, dtype, g):
    """x, dt, B, C as views of one packed projection [B, T, H*P + 2*G*N + H], as the mixer splits it."""
    inner, gn = heads * head_dim, groups * dstate
    packed = torch.randn(batch, steps, inner + 2 * gn + heads, generator=g).to(dtype)
    x, B, C, dt = packed.split([inner, gn, gn, heads], dim=-1)
    return (x.reshape(batch, steps, heads, head_dim), dt, B.reshape(batch, steps, groups, dstate),
            C.reshape(batch, steps, groups, dstate))


def _fill(name: str) -> float | int:
    """What the other half of a strided pool holds."""
    return -7 if name in ("pnat", "buf_idx") else NAN


def _strided(roles: dict, device: str) -> tuple[dict, dict]:
    """(pools, views): each role copied into half 1 of a [S, 2, ...] tensor on `device`, half 0 `_fill`."""
    pools, views = {}, {}
    for name, role in roles.items():
        pool = torch.full((role.shape[0], 2, *role.shape[1:]), _fill(name), dtype=role.dtype)
        pool[:, 1] = role
        pools[name] = pool.to(device)
        views[name] = pools[name][:, 1]
    return pools, views


def _run_case(heads: int, head_dim: int, groups: int, dstate: int, hist: int, steps: int, dtype, seed: int,
              block_p: int | None = None, closed_form: bool = False, num_warps: int | None = None,
              run: int | None = None, heads_form: bool = False) -> None:
    """One verify step of the batch above, by `mamba2_verify_triton` (`block_p`, `closed_form`, `num_warps`), or
    where `run` is given (or `heads_form`: at its default run) by the heads form (`triton_verify_heads`)."""
    g = torch.Generator().manual_seed(seed)
    kw = _params(heads, seed) | dict(dt_limit=(0.0, 3.0))
    pnat = _pnat(hist, steps)
    before = _roles(len(pnat), heads, head_dim, groups, dstate, hist, dtype, kw["A"], g, pnat, BUFS)
    _poison(before, pnat, BUFS)
    inputs = _inputs(len(SLOTS), steps, heads, head_dim, groups, dstate, dtype, g)
    slots = torch.tensor(SLOTS)

    ref, torch_path = _clone(before), _clone(before)
    y_ref = _verify(mamba2_verify_ref, inputs, ref, slots, kw)
    y_torch = _verify(mamba2_verify, inputs, torch_path, slots, kw)  # CPU tensors: the torch path
    pools, views = _strided(before, DEVICE)
    dev_kw = {k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in kw.items()}
    x, dt, B, C = (t.to(DEVICE) for t in inputs)
    pool_args = (*(views[n] for n in ROLE_NAMES), views["pnat"], views["buf_idx"], slots.to(DEVICE))
    if run is None and not heads_form:
        y = triton_verify.mamba2_verify_triton(
            x, dt, dev_kw["A"], B, C, *pool_args, D=dev_kw["D"], dt_bias=dev_kw["dt_bias"], dt_limit=kw["dt_limit"],
            block_p=block_p, closed_form=closed_form, num_warps=num_warps,
        ).cpu()
    else:
        y = triton_verify_heads.mamba2_verify_heads_triton(
            x, dt, dev_kw["A"], B, C, *pool_args, dev_kw["D"], dev_kw["dt_bias"], kw["dt_limit"], run=run,
            num_warps=num_warps,
        ).cpu()

    assert y.dtype == dtype
    torch.testing.assert_close(y, y_ref, **Y_TOL[dtype])
    torch.testing.assert_close(y, y_torch, **Y_TOL[dtype])
    for name, pool in pools.items():  # the other half of every pool is untouched
        other = pool[:, 0].cpu()
        assert torch.equal(_bits(other), _bits(torch.full_like(other, _fill(name)))), name
    got = {name: pool[:, 1].cpu() for name, pool in pools.items()}
    assert torch.equal(got["pnat"], before["pnat"]) and torch.equal(got["buf_idx"], before["buf_idx"])
    written = _written(before, pnat, BUFS, SLOTS, hist, steps)
    assert written["ssm"][:, 0, 0, 0].any() and not written["ssm"][:, 0, 0, 0].all()  # both kinds of row
    for name in ROLE_NAMES:
        mask = written[name]
        assert torch.equal(_bits(ref[name])[~mask], _bits(before[name])[~mask]), f"{name}: the mask misses a write"
        assert torch.equal(_bits(got[name])[~mask], _bits(before[name])[~mask]), f"{name}: written outside the step"
        if name in ("replay_x", "replay_B"):
            assert torch.equal(_bits(got[name])[mask], _bits(torch_path[name])[mask]), name
        else:
            torch.testing.assert_close(got[name][mask], ref[name][mask], **FP32, msg=name)
            torch.testing.assert_close(got[name][mask], torch_path[name][mask], **FP32, msg=name)


@pytest.mark.parametrize("closed_form", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("steps", [1, 2, 4])
def test_matches_reference_and_torch_path(steps: int, groups: int, dtype: torch.dtype, closed_form: bool) -> None:
    """Token by token, and in closed form (the new tokens, and the history's share, as products)."""
    _run_case(heads=4, head_dim=8, groups=groups, dstate=8, hist=8, steps=steps, dtype=dtype, seed=steps + groups,
              closed_form=closed_form)


@pytest.mark.parametrize("closed_form", [False, True])
def test_long_history_and_several_p_blocks(closed_form: bool) -> None:
    """HIST = 20: the fold reads 16 tokens at a time (p = 16, 17, 20 take one and two chunks); P = 32 in
    two programs of 16 channels; N = 16 fills the tile without padding."""
    _run_case(heads=4, head_dim=32, groups=2, dstate=16, hist=20, steps=4, dtype=torch.float32, seed=11, block_p=16,
              closed_form=closed_form)


@pytest.mark.parametrize("num_warps", [2, 8])
def test_closed_form_at_other_warps(num_warps: int) -> None:
    """The closed form with 2 or 8 warps a program (a tiling: the same values within rounding), folding rows
    among them. (The interpreter has no warps: on CPU this checks only that the option is taken.)"""
    _run_case(heads=4, head_dim=32, groups=2, dstate=32, hist=20, steps=4, dtype=torch.bfloat16, seed=5, block_p=16,
              closed_form=True, num_warps=num_warps)


@pytest.mark.parametrize("run,dtype", [(1, torch.float32), (2, torch.bfloat16), (4, torch.float32)])
def test_heads_form_at_every_run(run: int, dtype: torch.dtype) -> None:
    """The heads form (a program a row, group and run of heads) at 1, 2 and 4 of a group's 4 heads (fp32, bf16,
    fp32), HIST = 20 (a 32-token history product; p = 16, 17, 20 fold), P = 24 and N = 12 padded to 32 and 16."""
    _run_case(heads=8, head_dim=24, groups=2, dstate=12, hist=20, steps=4, dtype=dtype, seed=run, run=run)


@pytest.mark.parametrize("fold_run", [4, 3])
def test_heads_form_folds_several_heads_a_program(monkeypatch, fold_run: int) -> None:
    """The fold launch (the last heads first) at FOLD_RUN 4 heads a program (of 8), and at 3, which does not divide
    8 and falls back to 1: the folding rows' checkpoints as the reference's, the others' untouched (`_run_case`)."""
    monkeypatch.setattr(triton_verify_heads, "FOLD_RUN", fold_run)
    _run_case(heads=8, head_dim=24, groups=2, dstate=12, hist=20, steps=4, dtype=torch.float32, seed=7, run=2)


def test_heads_form_with_three_heads_a_group() -> None:
    """Three heads a group (no power of two) at the default run."""
    _run_case(heads=6, head_dim=8, groups=2, dstate=8, hist=8, steps=3, dtype=torch.float32, seed=3, run=None,
              closed_form=True, heads_form=True)


@pytest.mark.parametrize("rows,reps,expected", [(64, 8, 8), (16, 8, 4), (1, 8, 1), (16, 9, 3), (32, 6, 6), (8, 6, 2),
                                                (4, 8, 1)])
def test_default_run_divides_the_group(rows: int, reps: int, expected: int) -> None:
    """The largest divisor of the group's heads whose grid (rows x 8 groups x reps / run) has a program for each
    of 132 SMs, else 1."""
    assert triton_verify_heads.default_run(rows, 8, reps, 132) == expected


def test_heads_form_rejects_a_run_not_dividing_the_group() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        _run_case(heads=8, head_dim=8, groups=2, dstate=8, hist=8, steps=2, dtype=torch.float32, seed=1, run=3)


@pytest.mark.parametrize("hist,heads,rows_from,taken", [(8, True, 1, True), (32, True, len(SLOTS), True),
                                                         (33, True, 1, False), (8, False, 1, False),
                                                         (8, True, len(SLOTS) + 1, False)])
def test_closed_form_takes_the_heads_form_where_on(monkeypatch, hist: int, heads: bool, rows_from: int,
                                                   taken: bool) -> None:
    """With no block_p asked for, the closed form runs the heads form where HEADS is on, the batch has at least
    HEADS_FROM rows and HIST <= MAX_HIST, else the one-head kernel; either way the results are those of the
    reference (checked in `_run_case`)."""
    calls = []
    real = triton_verify_heads.mamba2_verify_heads_triton
    monkeypatch.setattr(triton_verify_heads, "mamba2_verify_heads_triton",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(triton_verify, "HEADS", heads)
    monkeypatch.setattr(triton_verify, "HEADS_FROM", rows_from)
    assert triton_verify.MAX_HIST == 32
    _run_case(heads=2, head_dim=4, groups=1, dstate=4, hist=hist, steps=2, dtype=torch.float32, seed=hist,
              closed_form=True)
    assert calls == ([1] if taken else [])


@pytest.mark.parametrize("steps", [1, 3])
def test_steps_with_accept_match_torch_path(steps: int) -> None:
    """Verify steps with random accept counts between them (folds and buffer flips included): the kernel's
    pools and the torch path's stay together, and so do their effective states."""
    heads, head_dim, groups, dstate, hist = 4, 4, 2, 8, 4
    g = torch.Generator().manual_seed(steps)
    kw = _params(heads, steps)
    torch_path = _roles(4, heads, head_dim, groups, dstate, hist, torch.float32, kw["A"], g)
    kernel = {k: v.to(DEVICE, copy=True) for k, v in torch_path.items()}  # a copy on the CPU too
    dev_kw = {k: v.to(DEVICE) for k, v in kw.items()}
    slots = torch.tensor([2, -1, 0, 3])
    folds = flips = 0
    for _ in range(6):  # T = 1 folds at the fifth step
        inputs = _inputs(4, steps, heads, head_dim, groups, dstate, torch.float32, g)
        num_valid = torch.randint(1, steps + 1, (4,), generator=g)
        folds += int(((torch_path["pnat"][slots.clamp_min(0)] + steps > hist) & (slots >= 0)).sum())
        y_torch = _verify(mamba2_verify, inputs, torch_path, slots, kw)
        y = _verify(triton_verify.mamba2_verify_triton, [t.to(DEVICE) for t in inputs], kernel, slots.to(DEVICE),
                    dev_kw)
        torch.testing.assert_close(y.cpu(), y_torch, **FP32)
        before_buf = torch_path["buf_idx"].clone()
        mamba2_accept(torch_path["pnat"], torch_path["buf_idx"], slots, steps, num_valid, hist=hist)
        flips += int((before_buf != torch_path["buf_idx"]).sum())
        mamba2_accept(kernel["pnat"], kernel["buf_idx"], slots.to(DEVICE), steps, num_valid.to(DEVICE), hist=hist)
        for name in ROLE_NAMES:
            torch.testing.assert_close(kernel[name].cpu(), torch_path[name], **FP32, msg=name)
        assert torch.equal(kernel["pnat"].cpu(), torch_path["pnat"])
        assert torch.equal(kernel["buf_idx"].cpu(), torch_path["buf_idx"])
    state = replay_state(*(torch_path[n] for n in ROLE_NAMES), torch_path["pnat"], torch_path["buf_idx"], slots)
    state_kernel = replay_state(*(kernel[n].cpu() for n in ROLE_NAMES), kernel["pnat"].cpu(),
                                kernel["buf_idx"].cpu(), slots)
    torch.testing.assert_close(state_kernel, state, **FP32)
    assert folds > 0 and flips > 0


def test_verify_dispatches_to_the_kernel(monkeypatch) -> None:
    """`mamba2_verify` hands a call to the kernel whenever `runs_triton` says so (CUDA; forced here)."""
    calls = []
    real = triton_verify.mamba2_verify_triton
    monkeypatch.setattr(replay, "runs_triton", lambda t: True)
    monkeypatch.setattr(triton_verify, "mamba2_verify_triton", lambda *a, **k: calls.append(1) or real(*a, **k))
    heads, head_dim, groups, dstate, hist, steps = 4, 4, 2, 4, 4, 2
    g = torch.Generator().manual_seed(3)
    kw = {k: v.to(DEVICE) for k, v in _params(heads).items()}
    roles = {k: v.to(DEVICE) for k, v in _roles(2, heads, head_dim, groups, dstate, hist, torch.float32, kw["A"].cpu(), g,
                                                  [1, 3], [0, 1]).items()}
    direct = _clone(roles)
    inputs = [t.to(DEVICE) for t in _inputs(2, steps, heads, head_dim, groups, dstate, torch.float32, g)]
    slots = torch.tensor([1, 0], device=DEVICE)
    y = _verify(mamba2_verify, inputs, roles, slots, kw)
    assert calls == [1]
    y_direct = _verify(real, inputs, direct, slots, kw)
    assert torch.equal(y, y_direct)
    for name in ROLE_NAMES:
        assert torch.equal(roles[name], direct[name]), name


def test_empty_batch() -> None:
    heads, head_dim, groups, dstate, hist = 4, 4, 2, 4, 4
    g = torch.Generator().manual_seed(0)
    kw = {k: v.to(DEVICE) for k, v in _params(heads).items()}
    roles = {k: v.to(DEVICE) for k, v in _roles(2, heads, head_dim, groups, dstate, hist, torch.float32, kw["A"].cpu(),
                                                  g).items()}
    inputs = [t.to(DEVICE) for t in _inputs(0, 2, heads, head_dim, groups, dstate, torch.float32, g)]
    y = _verify(triton_verify.mamba2_verify_triton, inputs, roles, torch.zeros(0, dtype=torch.long, device=DEVICE), kw)
    assert y.shape == (0, 2, heads, head_dim)


@pytest.mark.parametrize("rows,closed_form,expected", [
    (64, True, 32),  # nemotron_h 1B at batch 1: 64 (row, head) pairs; 64 channels a program would fill half the SMs
    (1024, True, 64),  # batch 16: the whole 64 x 128 tile (the fastest measured, 30.9 against 34.2 us at 32)
    (1024, False, 32),  # token by token: at most 4,096 state elements a program
    (4, True, 16),  # never under a dot's 16 channels
])
def test_default_block_p_follows_the_form_and_the_grid(rows, closed_form, expected):
    """`default_block_p` at nemotron_h 1B's head (64 channels, state 128) on a 132-SM device."""
    assert triton_verify.default_block_p(rows, 64, 128, closed_form, 132) == expected
