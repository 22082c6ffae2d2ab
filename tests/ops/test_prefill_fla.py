"""Prefill of Gated DeltaNet, KDA and Mamba2 on flash-linear-attention's chunk kernels, through the slots.

The glue, on every machine (no triton needed): fla's kernels are swapped for stand-ins that take fla's
exact keywords (checked against fla's own signatures where fla imports) and assert what fla needs of a
varlen call (a flat batch, fp32 initial states [N, ...] free of NaN, cu_seqlens on the tensors' device).
Stand-in one is a reference: our torch `chunk_*` for GDN / KDA, and a per-token simple-GLA loop for
Mamba2, so the Mamba2 <-> simple GLA mapping is checked against the naive Mamba2. Stand-in two returns
states + 1 and zero outputs, for exact checks of which slots are read and written, with no host sync.

The kernels: fla's own, on CUDA or on CPU tensors in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 where there is no GPU). Two shims let fla run in triton 3.6's interpreter, for these
tests only: the interpreter has no benchmarker for the autotuner (it gets one that times nothing, so the
first config runs), and it hands plain Python ints to a kernel's `for i in range(n)` loops where fla calls
`.to(tl.int64)` on the index (fla's modules get a `range` yielding interpreter tensors inside kernels).
bf16 runs on CUDA only: the interpreter's `tl.dot` on bf16 operands is wrong (a 16 x 16 bf16 dot comes
out ~1e10 off), so those cases skip on the CPU.

Rows of 1, 63, 64, 0, 65 and 200 tokens (fla tiles by 64), slots out of order, one padding row whose
tokens are NaN, two rows starting fresh on NaN slots; the slots no live row owns are NaN and must stay
so, bit for bit.
Tolerances: relative L2 error (|a - b| / |b|) per sequence for outputs and per slot for states, against
the fp32 references: fp32 in the interpreter 1e-5 (IEEE fp32 both sides, summed in another order); fp32
on CUDA 1e-2 (fla's fp32 dots run in TF32, a 10-bit mantissa); bf16 3e-2 (fla keeps per-chunk states and
WY terms in bf16, ~4e-3 per rounding). The torch stand-ins: 1e-4 fp32, 1e-2 bf16 (outputs rounded to
bf16). A slip in the glue (a wrong slot, head, layout, gate or skip) shows as an error of order 1.
"""
from __future__ import annotations

import builtins
import inspect
import sys

import pytest
import torch
from torch import Tensor

import hybridcache.ops.gdn.chunk as gdn_chunk
import hybridcache.ops.kda.chunk as kda_chunk
import hybridcache.ops.mamba2.prefill as mamba2_module
from hybridcache.ops import fla_kernels
from hybridcache.ops.fla_kernels import FlaOps, fla_testable
from hybridcache.ops.gdn.chunk import gdn_prefill, gdn_prefill_fla
from hybridcache.ops.gdn.naive import naive_gdn_prefill
from hybridcache.ops.kda.chunk import kda_prefill, kda_prefill_fla
from hybridcache.ops.kda.naive import naive_kda_prefill
from hybridcache.ops.mamba2.naive import mamba2_prefill_ref
from hybridcache.ops.mamba2.prefill import mamba2_prefill, mamba2_prefill_fla
from tests.ops.delta_rule_cases import delta_inputs
from tests.ops.fla_stand_ins import REFERENCE_OPS
from tests.ops.tripwire import count_host_syncs, no_host_sync

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAN = float("nan")
LENS = [1, 63, 64, 0, 65, 200]
SLOTS = [3, -1, 0, 6, 5, 2]  # row 1 is padding; slots 1, 4 and 7 belong to no row
HAS_INITIAL = [True, True, False, True, True, False]  # rows 2 and 5 start fresh on NaN slots
NUM_SLOTS = 8
# KDA's token-parallel intra-chunk kernel costs ~65 ms a program in the interpreter: there the last row is
# cut to 2 tokens (the 65-token row still crosses a chunk boundary)
KDA_LENS = LENS if DEVICE == "cuda" else LENS[:-1] + [2]
K, V = 32, 16  # key and value widths differ, so a transposed state cannot pass by shape
DT_LIMIT = (0.05, 1.0)  # both ends clamp


# the scenario


def cu_of(lens: list[int], dtype: torch.dtype = torch.int32) -> Tensor:
    """cu_seqlens [B+1] (int32, as the engine builds it)."""
    return torch.tensor([0] + lens).cumsum(0).to(dtype)


def rows() -> tuple[Tensor, Tensor]:
    return torch.tensor(SLOTS), torch.tensor(HAS_INITIAL)


def pool(state_shape: tuple[int, ...], seed: int) -> Tensor:
    """[NUM_SLOTS, *state_shape] fp32: NaN but for the slots live rows start from."""
    gen = torch.Generator().manual_seed(seed)
    ssm = torch.full((NUM_SLOTS, *state_shape), NAN)
    for slot, start in zip(SLOTS, HAS_INITIAL):
        if slot >= 0 and start:
            ssm[slot] = torch.randn(state_shape, generator=gen)
    return ssm


def gdn_inputs(n: int, H: int, HV: int, dtype: torch.dtype, seed: int = 0) -> list[Tensor]:
    """As the mixer hands them over: q, k [n, H, K], v [n, HV, V] and beta [n, HV] in dtype; g (log-decay)
    [n, HV] fp32."""
    q, k, v, g, beta = (t[0] for t in delta_inputs(1, n, H, HV, K, V, (HV,), dtype, seed))
    return [q, k, v, g, beta.to(dtype)]


def kda_inputs(n: int, H: int, dtype: torch.dtype, seed: int = 0) -> list[Tensor]:
    """As the mixer hands them over: q, k [n, H, K], v [n, H, V] and beta [n, H] in dtype; g [n, H, K]
    per-channel log-decay fp32."""
    q, k, v, g, beta = (t[0] for t in delta_inputs(1, n, H, H, K, V, (H, K), dtype, seed))
    return [q, k, v, g, beta.to(dtype)]


def mamba2_inputs(n: int, heads: int, head_dim: int, groups: int, dstate: int, dtype: torch.dtype,
                  seed: int = 0) -> dict[str, Tensor]:
    """As the mixer hands them over: x [n, H, P], dt [n, H] raw, B, C [n, G, N], D and dt_bias [H] in dtype;
    A [H] fp32 (negative)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, heads, head_dim, generator=gen)
    dt = torch.randn(n, heads, generator=gen)
    B, C = (torch.randn(n, groups, dstate, generator=gen) for _ in range(2))
    A = -torch.exp(torch.rand(heads, generator=gen) * 2 - 1)
    D, dt_bias = torch.randn(heads, generator=gen), torch.rand(heads, generator=gen) - 2.0
    return dict(x=x.to(dtype), dt=dt.to(dtype), A=A, B=B.to(dtype), C=C.to(dtype), D=D.to(dtype),
                dt_bias=dt_bias.to(dtype))


def nan_padding(tensors: list[Tensor], lens: list[int]) -> list[Tensor]:
    """Copies with the padding rows' tokens NaN: whatever leaks from them into a live row or slot shows."""
    cu = cu_of(lens).tolist()
    out = [t.clone() for t in tensors]
    for i, slot in enumerate(SLOTS):
        if slot < 0:
            for t in out:
                t[cu[i]:cu[i + 1]] = NAN
    return out


def tolerance(dtype: torch.dtype, on: str) -> float:
    """fla's kernels against the fp32 references (module docstring)."""
    if dtype == torch.bfloat16:
        return 3e-2
    return 1e-2 if on == "cuda" else 1e-5


def rel_err(a: Tensor, b: Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(o: Tensor, o_ref: Tensor, ssm: Tensor, ssm_ref: Tensor, before: Tensor, lens: list[int], tol: float) -> None:
    """Live rows' outputs per sequence and live slots' states (finite, relative error <= tol); every other
    slot bit for bit as before (NaN stays NaN)."""
    cu = cu_of(lens).tolist()
    o, ssm = o.cpu(), ssm.cpu()
    for i, slot in enumerate(SLOTS):
        if slot < 0:
            continue
        span = slice(cu[i], cu[i + 1])
        assert torch.isfinite(o[span]).all(), f"row {i}: non-finite output"
        assert rel_err(o[span], o_ref[span]) <= tol, f"row {i} output: {rel_err(o[span], o_ref[span]):.2e} > {tol}"
    live = {s for s in SLOTS if s >= 0}
    for s in range(NUM_SLOTS):
        if s in live:
            assert torch.isfinite(ssm[s]).all(), f"slot {s}: non-finite state"
            assert rel_err(ssm[s], ssm_ref[s]) <= tol, f"slot {s} state: {rel_err(ssm[s], ssm_ref[s]):.2e} > {tol}"
        else:
            torch.testing.assert_close(ssm[s], before[s], rtol=0, atol=0, equal_nan=True)


def run_delta(fast, naive, x: list[Tensor], ssm: Tensor, lens: list[int], device: str, tol: float,
              cu_dtype: torch.dtype = torch.int32) -> None:
    """A slot-facing GDN / KDA prefill on `device` against its naive reference on the CPU."""
    cu = cu_of(lens, cu_dtype)
    slots, has_initial = rows()
    x = nan_padding(x, lens)
    ref = ssm.clone()
    o_ref = naive(*x, cu, ref, slots, has_initial, use_qk_l2norm_in_kernel=True)
    fast_pool = ssm.clone().to(device)
    o = fast(*(t.to(device) for t in x), cu.to(device), fast_pool, slots.to(device), has_initial.to(device),
             use_qk_l2norm_in_kernel=True)
    assert o.dtype == x[2].dtype and o.shape == x[2].shape and o.device.type == device
    check(o, o_ref, fast_pool, ref, ssm, lens, tol)


def run_mamba2(fast, d: dict[str, Tensor], ssm: Tensor, lens: list[int], device: str, tol: float) -> None:
    """A slot-facing Mamba2 prefill on `device` against `mamba2_prefill_ref` on the CPU."""
    cu = cu_of(lens)
    slots, has_initial = rows()
    d = d | dict(zip("x dt B C".split(), nan_padding([d["x"], d["dt"], d["B"], d["C"]], lens)))
    ref = ssm.clone()
    y_ref = mamba2_prefill_ref(d["x"], d["dt"], d["A"], d["B"], d["C"], ref, slots, has_initial, cu, D=d["D"],
                               dt_bias=d["dt_bias"], dt_limit=DT_LIMIT)
    on = {name: t.to(device) for name, t in d.items()}
    fast_pool = ssm.clone().to(device)
    y = fast(on["x"], on["dt"], on["A"], on["B"], on["C"], fast_pool, slots.to(device), has_initial.to(device),
             cu.to(device), D=on["D"], dt_bias=on["dt_bias"], dt_limit=DT_LIMIT)
    assert y.dtype == d["x"].dtype and y.shape == d["x"].shape and y.device.type == device
    check(y, y_ref, fast_pool, ref, ssm, lens, tol)


def plus_one(q, k, v, *args, initial_state=None, cu_seqlens=None, **kwargs):
    """Outputs of zeros, final states = initial + 1 (exact, and no host sync)."""
    return torch.zeros_like(v, dtype=q.dtype), initial_state + 1


@pytest.fixture
def reference_ops(monkeypatch):
    monkeypatch.setattr(fla_kernels, "fla_ops", lambda: REFERENCE_OPS)


@pytest.mark.parametrize("name", FlaOps._fields)
def test_stand_ins_take_flas_keywords(name):
    """Every keyword our wrappers pass (the stand-ins' parameters) is a named parameter of fla's function,
    with q, k, v (and g, beta) first, in that order."""
    real_ops = fla_kernels.fla_ops()
    if real_ops is None:
        pytest.skip("fla-core (with triton) is not importable")
    real = inspect.signature(getattr(real_ops, name)).parameters
    ours = list(inspect.signature(getattr(REFERENCE_OPS, name)).parameters)
    assert all(p in real and real[p].kind is not inspect.Parameter.VAR_KEYWORD for p in ours), (ours, list(real))
    assert list(real)[:3] == ours[:3] == ["q", "k", "v"]
    if name != "chunk_simple_gla":
        assert list(real)[3:5] == ours[3:5] == ["g", "beta"]


# the glue, through the reference stand-ins


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4)])  # value heads 2j, 2j + 1 read key head j
def test_gdn_glue_matches_naive(reference_ops, device, dtype, H, HV):
    x = gdn_inputs(sum(LENS), H, HV, dtype)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    run_delta(gdn_prefill_fla, naive_gdn_prefill, x, pool((HV, K, V), seed=1), LENS, device, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kda_glue_matches_naive(reference_ops, device, dtype):
    x = kda_inputs(sum(LENS), 2, dtype)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    run_delta(kda_prefill_fla, naive_kda_prefill, x, pool((2, K, V), seed=1), LENS, device, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 2])
def test_mamba2_as_simple_gla_matches_naive(reference_ops, device, dtype, groups):
    d = mamba2_inputs(sum(LENS), 4, 8, groups, 16, dtype)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    run_mamba2(mamba2_prefill_fla, d, pool((4, 8, 16), seed=2), LENS, device, tol)


@pytest.mark.parametrize("op", ["gdn", "kda", "mamba2"])
def test_glue_reads_and_writes_only_the_rows_slots_without_host_sync(monkeypatch, device, op):
    """With final state = initial + 1: a live row's slot ends at its state (zeros when it starts fresh) + 1,
    every other slot is untouched, outputs sit where the kernel put them (Mamba2: 0 + D·x); no host sync."""
    monkeypatch.setattr(fla_kernels, "fla_ops", lambda: FlaOps(plus_one, plus_one, plus_one))
    n = sum(LENS)
    slots, has_initial = rows()
    cu = cu_of(LENS).to(device)
    if op == "mamba2":
        d = {name: t.to(device) for name, t in mamba2_inputs(n, 4, 8, 2, 16, torch.bfloat16).items()}
        ssm = pool((4, 8, 16), seed=3)
        fast = ssm.clone().to(device)
        with no_host_sync():
            o = mamba2_prefill_fla(d["x"], d["dt"], d["A"], d["B"], d["C"], fast, slots.to(device),
                                   has_initial.to(device), cu, D=d["D"], dt_bias=d["dt_bias"])
        expected_o = (d["D"].float()[:, None] * d["x"].float()).to(torch.bfloat16)
    else:
        x = gdn_inputs(n, 2, 4, torch.bfloat16) if op == "gdn" else kda_inputs(n, 2, torch.bfloat16)
        x = [t.to(device) for t in x]
        ssm = pool((x[2].shape[1], K, V), seed=3)
        fast = ssm.clone().to(device)
        fn = gdn_prefill_fla if op == "gdn" else kda_prefill_fla
        with no_host_sync():
            o = fn(*x, cu, fast, slots.to(device), has_initial.to(device), use_qk_l2norm_in_kernel=True)
        expected_o = torch.zeros_like(x[2])
    assert torch.equal(o, expected_o)
    expected = ssm.clone()
    for slot, start in zip(SLOTS, HAS_INITIAL):
        if slot >= 0:
            expected[slot] = (ssm[slot] if start else torch.zeros_like(ssm[slot])) + 1
    torch.testing.assert_close(fast.cpu(), expected, rtol=0, atol=0, equal_nan=True)


# the slot-facing entry points and their fla paths (`test_prefill_dispatch.py` checks which one runs)
ROUTES = {"gdn": (gdn_chunk, gdn_prefill, "gdn_prefill_fla"), "kda": (kda_chunk, kda_prefill, "kda_prefill_fla"),
          "mamba2": (mamba2_module, mamba2_prefill, "mamba2_prefill_fla")}


# fla's kernels


def _interpreter_shims(mp: pytest.MonkeyPatch) -> None:
    """Let fla's kernels run in triton 3.6's interpreter (module docstring)."""
    import triton.runtime.autotuner as autotuner
    import triton.runtime.interpreter as interpreter

    mp.setattr(autotuner.Autotuner, "do_bench", property(lambda self: lambda fn, quantiles: [0.0, 0.0, 0.0]))
    kernels = interpreter.InterpretedFunction.rewritten_fn

    def kernel_range(*args):
        steps = builtins.range(*args)
        if sys._getframe(1).f_code in {fn.__code__ for fn in kernels.values()}:
            return (interpreter._implicit_cvt(i) for i in steps)
        return steps

    for name, module in list(sys.modules.items()):
        if name.startswith("fla.") and module is not None:
            mp.setattr(module, "range", kernel_range, raising=False)


@pytest.fixture(scope="module")
def fla_here():
    """Skip unless fla's kernels run on DEVICE; in the interpreter, with the shims for this module's tests."""
    if not fla_testable(torch.empty(0, device=DEVICE)):
        pytest.skip("needs fla-core and triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)")
    with pytest.MonkeyPatch.context() as mp:
        if DEVICE == "cpu":
            _interpreter_shims(mp)
        yield


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("triton 3.6's interpreter computes tl.dot on bf16 operands wrongly; bf16 runs on CUDA")
    return dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4)])  # value heads 2j, 2j + 1 read key head j
def test_gdn_fla_matches_naive(fla_here, dtype, H, HV):
    x = gdn_inputs(sum(LENS), H, HV, kernel_dtype(dtype), seed=4)
    run_delta(gdn_prefill_fla, naive_gdn_prefill, x, pool((HV, K, V), seed=5), LENS, DEVICE, tolerance(dtype, DEVICE))


def test_gdn_fla_takes_int64_offsets(fla_here):
    x = gdn_inputs(sum(LENS), 1, 2, torch.float32, seed=6)
    run_delta(gdn_prefill_fla, naive_gdn_prefill, x, pool((2, K, V), seed=7), LENS, DEVICE,
              tolerance(torch.float32, DEVICE), cu_dtype=torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kda_fla_matches_naive(fla_here, dtype):
    x = kda_inputs(sum(KDA_LENS), 2, kernel_dtype(dtype), seed=8)
    run_delta(kda_prefill_fla, naive_kda_prefill, x, pool((2, K, V), seed=9), KDA_LENS, DEVICE,
              tolerance(dtype, DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 2])
def test_mamba2_fla_matches_naive(fla_here, dtype, groups):
    d = mamba2_inputs(sum(LENS), 4, 16, groups, 32, kernel_dtype(dtype), seed=10)
    run_mamba2(mamba2_prefill_fla, d, pool((4, 16, 32), seed=11), LENS, DEVICE, tolerance(dtype, DEVICE))


@pytest.mark.parametrize("op", list(ROUTES))
def test_prefill_on_cuda_runs_fla(cuda_only, fla_here, monkeypatch, op):
    """The public wrappers on bf16 CUDA tensors reach fla's kernels (a spy on the fla entry point)."""
    module, prefill, fla_entry = ROUTES[op]
    real, calls = getattr(module, fla_entry), []
    monkeypatch.setattr(module, fla_entry, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    tol = tolerance(torch.bfloat16, "cuda")
    if op == "gdn":
        x = gdn_inputs(sum(LENS), 2, 4, torch.bfloat16, seed=12)
        run_delta(prefill, naive_gdn_prefill, x, pool((4, K, V), seed=13), LENS, "cuda", tol)
    elif op == "kda":
        x = kda_inputs(sum(LENS), 2, torch.bfloat16, seed=14)
        run_delta(prefill, naive_kda_prefill, x, pool((2, K, V), seed=15), LENS, "cuda", tol)
    else:
        d = mamba2_inputs(sum(LENS), 4, 16, 2, 32, torch.bfloat16, seed=16)
        run_mamba2(prefill, d, pool((4, 16, 32), seed=17), LENS, "cuda", tol)
    assert calls == [1]


@pytest.mark.parametrize("op", list(ROUTES))
def test_fla_prefill_reads_cu_seqlens_once(cuda_only, fla_here, op):
    """On CUDA, a second call on the same cu_seqlens tensor (the next layer of a step) makes no host sync:
    fla's chunk indices are memoised by the tensor, and Mamba2's state pass is sized from them
    (`fla_kernels.simple_gla_forward`), not read back (CUDA's sync-debug mode counts what Python does not)."""
    module, prefill, _ = ROUTES[op]
    slots, has_initial = (t.cuda() for t in rows())
    cu = cu_of(LENS).cuda()
    if op == "mamba2":
        d = {name: t.cuda() for name, t in mamba2_inputs(sum(LENS), 4, 16, 2, 32, torch.bfloat16).items()}
        ssm = pool((4, 16, 32), seed=18).cuda()

        def call():
            return prefill(d["x"], d["dt"], d["A"], d["B"], d["C"], ssm, slots, has_initial, cu, D=d["D"],
                           dt_bias=d["dt_bias"])
    else:
        x = gdn_inputs(sum(LENS), 2, 4, torch.bfloat16) if op == "gdn" else kda_inputs(sum(LENS), 2, torch.bfloat16)
        x = [t.cuda() for t in x]
        ssm = pool((x[2].shape[1], K, V), seed=18).cuda()

        def call():
            return prefill(*x, cu, ssm, slots, has_initial, use_qk_l2norm_in_kernel=True)
    call()
    torch.cuda.synchronize()
    with count_host_syncs(cuda=True) as syncs:
        call()
    assert syncs.calls == [], syncs.calls
