"""The fused MoE kernels (`ops/moe`) against the experts' own torch forwards (`models/layers/experts.py`)
and the per-token references (`ops/moe/naive.py`); the routers' kernels are in test_moe_routers_triton.py.

The modules' forwards run with the dispatch forced to torch (the reference: `dispatch`'s grouped GEMMs on
the CPU) and then to Triton (`runs_triton` patched; a spy checks the kernels ran). Runs on CUDA, or on CPU
tensors in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where there is no CUDA device).
Tolerances. Experts, fp32: rtol 1e-5, atol 1e-5 (the same fp32 steps, the dot products summed in another
order: 2e-6 at most seen here, outputs of magnitude ~5). 16-bit: the kernels round where torch does, so
only a dot product that lands on a rounding boundary differs: every element within one bf16 ulp of the
output's largest magnitude (2^-7 relative), at most 1% of elements different at all (0 to 1 of 1152 seen).
"""
import pytest
import torch

from hybridcache.ops.triton_support import triton_testable

if not triton_testable(torch.empty(0, device="cuda" if torch.cuda.is_available() else "cpu")):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.models.layers import experts, routers  # noqa: E402
from hybridcache.models.layers.gated_mlp import GatedMLP  # noqa: E402
from hybridcache.models.layers.kimi_moe import KimiMoE  # noqa: E402
from hybridcache.ops.moe import (  # noqa: E402
    MAX_PAIRS, MAX_SORTED_PAIRS, SharedExpert, experts_sorted_triton, experts_triton, naive, routers_triton,
)
from hybridcache.ops.moe.sort import sort_by_expert  # noqa: E402
from tests.ops.moe_testing import BF16, D, DEVICE, F32, I, filled, launches, randn, routing  # noqa: E402,F401


def assert_experts_close(out: torch.Tensor, ref: torch.Tensor, weight_dtype: torch.dtype,
                         max_ulps: int = 1) -> None:
    """bf16: the largest difference at most `max_ulps` roundings of the largest output."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if weight_dtype == F32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        return
    diff = (out.float() - ref.float()).abs()
    assert diff.max() <= max_ulps * 2 ** -7 * ref.float().abs().max(), f"off by {diff.max().item()}"
    assert diff.mean() <= 2 ** -9 * ref.float().abs().mean(), f"mean difference {diff.mean().item()}"
    if not out.is_cuda:  # on a GPU the torch path's cuBLAS sums in another order: bf16 roundings flip more often;
        # on a CPU too its order follows the instruction set (one 2-core machine: 32 of 2,880, 1.1%)
        assert (diff > 0).float().mean() <= 0.02, f"{int((diff > 0).sum())} of {diff.numel()} elements differ"


def both(monkeypatch, launches, layer, module: torch.nn.Module, *inputs):
    """(torch forward, Triton forward) of `module` on the same inputs; asserts which path each took."""
    monkeypatch.setattr(layer, "runs_triton", lambda t: False)
    ref = module(*inputs)
    assert not launches
    monkeypatch.setattr(layer, "runs_triton", lambda t: True)
    out = module(*inputs)
    assert launches, "the forward did not take the Triton path"
    launches.clear()
    return ref, out


# (gated, dtype, E, k, N): every kind and dtype, k = 1 and 2, several E, N from 1 to MAX_PAIRS (k = 1)
CASES = [(True, F32, 4, 2, 1), (True, F32, 7, 1, 5), (True, BF16, 8, 2, 8), (True, BF16, 5, 1, 16),
         (True, BF16, 5, 2, 3), (False, F32, 6, 2, 4), (False, F32, 3, 1, 1), (False, BF16, 8, 2, 7)]


def check_forward(monkeypatch, launches, gated, dtype, e, k, n, used, entry):
    """GatedExperts (silu; weights in x's dtype, output in x's dtype) or Experts (relu2; fp32 router weights,
    fp32 output) routed to `used` of the `e` experts (spread over [0, e): gaps around the used ones): the
    Triton forward takes `entry` and equals the torch path and the per-token loop with the same roundings."""
    if gated:
        module, weight_dtype = experts.GatedExperts(e, D, I, "silu", DEVICE, dtype), dtype
    else:
        module, weight_dtype = experts.Experts(e, D, I, "relu2", DEVICE, dtype), F32
    filled(module, seed=e)
    x = randn(n, D, seed=1, dtype=dtype)
    index, weight = routing(n, used, k, seed=2, dtype=weight_dtype)
    index = index * (e // used) + (1 if 1 < used < e else 0)
    ref, _ = both(monkeypatch, launches, experts, module, x, index, weight)
    out = module(x, index, weight)
    assert launches == [entry]
    assert_experts_close(out, ref, dtype)
    loop = naive.fused_experts_naive(x, index, weight, module.up, module.down, getattr(module, "gate", None),
                                     module.act_name, ref.dtype)
    assert_experts_close(out, loop, dtype)


@pytest.mark.parametrize("gated, dtype, e, k, n", CASES)
def test_experts_match_the_torch_path_and_the_loop(monkeypatch, launches, gated, dtype, e, k, n):
    """Up to MAX_PAIRS the forwards take the one-pair-a-program kernels."""
    assert n * k <= MAX_PAIRS
    check_forward(monkeypatch, launches, gated, dtype, e, k, n, e, "fused_experts_triton")


@pytest.mark.parametrize("gated, act, tiles", [
    (True, "silu", None), (True, "gelu", None), (False, "relu2", None), (False, "relu", None),
    (True, "gelu", (1, 32, 32)), (False, "relu", (4, 32, 32))])
def test_activations_and_tiles(gated, act, tiles):
    """Every activation the kernels compute against the per-token loop: in the interpreter's arrangement (one
    program for every pair or token, all rows, the whole inner width), and with `tiles` (BLOCK, rows, inner):
    one pair (token) a program as on CUDA, or blocks of 4 with the last part empty; either way 3 row tiles
    and 3 inner steps, the last of each masked."""
    e, k, n = 5, 2, 3
    up, down = randn(e, I, D, seed=1, scale=D ** -0.5), randn(e, D, I, seed=2, scale=I ** -0.5)
    gate = randn(e, I, D, seed=3, scale=D ** -0.5) if gated else None
    x = randn(n, D, seed=4)
    index, weight = routing(n, e, k, seed=5, dtype=F32)
    out = experts_triton.fused_experts_triton(x, index, weight, up, down, gate, act, F32, tiles=tiles)
    ref = naive.fused_experts_naive(x, index, weight, up, down, gate, act, F32)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_strided_input_and_repeated_experts():
    """x a column slice of a wider tensor; one token routed to the same expert twice (weights summed)."""
    e = 3
    up, down, gate = randn(e, I, D, seed=1, scale=0.1), randn(e, D, I, seed=2, scale=0.1), randn(e, I, D, seed=3, scale=0.1)
    x = randn(2, D + 8, seed=4)[:, 8:]
    index = torch.tensor([[1, 1], [2, 0]], device=DEVICE)
    weight = torch.tensor([[0.25, 0.5], [1.0, 2.0]], device=DEVICE)
    out = experts_triton.fused_experts_triton(x, index, weight, up, down, gate, "silu", F32)
    torch.testing.assert_close(out, naive.fused_experts_naive(x, index, weight, up, down, gate, "silu", F32),
                               rtol=1e-5, atol=1e-5)


def test_large_batches_keep_the_grouped_path(monkeypatch, launches):
    module = filled(experts.GatedExperts(4, D, I, "silu", DEVICE, F32), seed=0)
    n = MAX_SORTED_PAIRS // 2 + 1  # k = 2: one pair over the limit
    index, weight = routing(n, 4, 2, seed=1, dtype=F32)
    monkeypatch.setattr(experts, "runs_triton", lambda t: True)
    module(randn(n, D, seed=2), index, weight)
    assert not launches


# (gated, dtype, E, k, N, experts used): past MAX_PAIRS; "used" < E leaves experts with no pair at the start,
# middle and end of the order, and puts more pairs on an expert than BLOCK_M (`block_m` sizes it for E):
# 72 pairs of E = 7 on 3 (BLOCK_M 16), 65 on 1 of 5 (32); E = 2 at k = 1 with N = 200: ~100 an expert (64)
SORTED_CASES = [(True, BF16, 8, 2, 40, 8), (False, F32, 6, 2, 33, 6), (True, F32, 3, 1, 70, 3),
                (True, BF16, 7, 2, 36, 3), (False, BF16, 5, 1, 65, 1), (True, F32, 2, 1, 200, 2)]


@pytest.mark.parametrize("gated, dtype, e, k, n, used", SORTED_CASES)
def test_sorted_kernels_match_the_torch_path_and_the_loop(monkeypatch, launches, gated, dtype, e, k, n, used):
    """Past MAX_PAIRS the forwards take the sorted kernels."""
    assert n * k > MAX_PAIRS
    check_forward(monkeypatch, launches, gated, dtype, e, k, n, used, "sorted_experts_triton")


# (dtype, E, k, N, M, gate logit, path): a shared expert of M parts (S = M·I) as M more pairs a token, on
# both kernels: N·(k+M) up to MAX_PAIRS one pair a program (5·3 = 15, 2·4 = 8, 1·6 = 6), past it sorted
# (6·3 = 18, 40·2 = 80 with k = 1, 40·6 = 240, 7·5 = 35); Kimi's is M = 1 without a logit, Qwen3-Next's
# 1B M = 4 with one
SHARED_CASES = [(F32, 4, 2, 5, 1, False, "fused_experts_triton"), (BF16, 8, 2, 1, 1, False, "fused_experts_triton"),
                (F32, 4, 2, 2, 2, True, "fused_experts_triton"), (BF16, 8, 2, 1, 4, True, "fused_experts_triton"),
                (F32, 8, 2, 6, 1, False, "sorted_experts_triton"), (BF16, 8, 2, 40, 1, False, "sorted_experts_triton"),
                (BF16, 3, 1, 40, 1, False, "sorted_experts_triton"), (BF16, 8, 2, 40, 4, True, "sorted_experts_triton"),
                (F32, 5, 2, 7, 3, True, "sorted_experts_triton"), (BF16, 4, 1, 40, 2, False, "sorted_experts_triton")]


def shared_reference(module, shared: GatedMLP, x, index, weight, logit: bool) -> torch.Tensor:
    """The torch path's sum (experts.runs_triton off): `routed + shared(x)`, or as SharedExpertMoE adds its
    gated shared expert without the fused glue, `routed + sigmoid(logit) * shared(x)`, in x's dtype."""
    routed = module(x, index, weight)
    if not logit:
        return routed + shared(x)
    out, gate = shared.forward_extra(x)
    return routed + torch.sigmoid(gate) * out


@pytest.mark.parametrize("dtype, e, k, n, parts, logit, entry", SHARED_CASES)
def test_a_shared_expert_runs_in_the_experts_kernels(monkeypatch, launches, dtype, e, k, n, parts, logit, entry):
    """GatedExperts with a shared GatedMLP of `parts` times a routed expert's width (with a sigmoid gate row
    where `logit`): one fused call that equals the torch path's sum and the per-token loop with the shared
    expert added last."""
    module = filled(experts.GatedExperts(e, D, I, "silu", DEVICE, dtype), seed=e)
    shared = filled(GatedMLP(D, parts * I, "silu", DEVICE, dtype, extra_rows=int(logit)), seed=e + 1)
    x = randn(n, D, seed=1, dtype=dtype)
    index, weight = routing(n, e, k, seed=2, dtype=F32)
    monkeypatch.setattr(experts, "runs_triton", lambda t: False)
    ref = shared_reference(module, shared, x, index, weight, logit)
    weights = shared.as_shared_expert(gate_logit=logit)
    assert weights.parts(I) == parts and not module.takes_shared(x, index, weights)
    monkeypatch.setattr(experts, "runs_triton", lambda t: True)
    assert module.takes_shared(x, index, weights)
    out = module(x, index, weight, shared=weights)
    assert launches == [entry]
    assert_experts_close(out, ref, dtype)
    loop = naive.fused_experts_naive(x, index, weight, module.up, module.down, module.gate, "silu", dtype,
                                     shared=weights)
    assert_experts_close(out, loop, dtype, max_ulps=2)  # the loop rounds the routed sum, then adds the shared


def test_the_gate_logit_scales_the_shared_expert():
    """A mutation guard for the logit: with the gate row zeroed every token's shared term is halved
    (sigmoid(0) = 1/2), so the output moves from the ungated one by exactly half the shared expert's output."""
    e, k, n = 4, 2, 3
    module = filled(experts.GatedExperts(e, D, I, "silu", DEVICE, F32), seed=1)
    shared = filled(GatedMLP(D, 2 * I, "silu", DEVICE, F32, extra_rows=1), seed=2)
    x = randn(n, D, seed=3)
    index, weight = routing(n, e, k, seed=4, dtype=F32)
    args = (x, index, weight, module.up, module.down, module.gate, "silu", F32)
    with torch.no_grad():
        shared.extra_weight.zero_()
    half = experts_triton.fused_experts_triton(*args, shared=shared.as_shared_expert(gate_logit=True))
    whole = experts_triton.fused_experts_triton(*args, shared=shared.as_shared_expert())
    routed = experts_triton.fused_experts_triton(*args)
    torch.testing.assert_close(whole - half, 0.5 * shared(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(half - routed, 0.5 * shared(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
def test_inputs_in_the_weight_layout_change_no_bit(monkeypatch, dtype):
    """h loaded in the weight tile's layout in the down kernel (`X_IN_TILE`) against loaded once and broadcast
    over the rows: the same products summed in the same order, so every output bit for bit; a gated shared
    expert of two parts with its logit, at the wrapper's tiling (on CUDA one token a program, rows off the sizes)."""
    e, k, n = 4, 2, 3
    module = filled(experts.GatedExperts(e, D, I, "silu", DEVICE, dtype), seed=7)
    shared = filled(GatedMLP(D, 2 * I, "silu", DEVICE, dtype, extra_rows=1), seed=8).as_shared_expert(gate_logit=True)
    x = randn(n, D, seed=9, dtype=dtype)
    index, weight = routing(n, e, k, seed=10, dtype=dtype)
    args = (x, index, weight, module.up, module.down, module.gate, "silu", dtype)
    tiled = experts_triton.fused_experts_triton(*args, shared=shared)
    monkeypatch.setattr(experts_triton, "X_IN_TILE", False)
    assert torch.equal(tiled, experts_triton.fused_experts_triton(*args, shared=shared))


@pytest.mark.parametrize("up_launch, down_launch", [((4, 16, 2), (64, 32, 8)), ((32, 64, 1), (8, 16, 4))])
def test_each_kernels_launch_choice_leaves_the_result(up_launch, down_launch):
    """`up_launch` / `down_launch` (rows, inner step, warps, one pair or token a program; the tiling sweep's
    knobs) on their own kernel, with a gated shared expert of two parts: the same sums as `_tiles`' choice
    (rows and inner steps off the sizes, so the last of each is masked)."""
    e, k, n = 4, 2, 3
    module = filled(experts.GatedExperts(e, D, I, "silu", DEVICE, F32), seed=3)
    shared = filled(GatedMLP(D, 2 * I, "silu", DEVICE, F32, extra_rows=1), seed=4).as_shared_expert(gate_logit=True)
    x = randn(n, D, seed=5)
    index, weight = routing(n, e, k, seed=6, dtype=F32)
    args = (x, index, weight, module.up, module.down, module.gate, "silu", F32)
    want = experts_triton.fused_experts_triton(*args, tiles=(1, 32, 32), shared=shared)
    got = experts_triton.fused_experts_triton(*args, shared=shared, up_launch=up_launch, down_launch=down_launch)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_which_shared_experts_the_kernels_take(monkeypatch):
    """`SharedExpert.fits`: any multiple of I with the routed experts' D, dtype and gating; a width that is
    not a multiple, another dtype, a non-gated one beside gated experts, a gate row of the wrong width: no.
    The forward refuses what `takes_shared` refuses, with a ValueError."""
    module = filled(experts.GatedExperts(4, D, I, "silu", DEVICE, F32), seed=3)
    args = (module.up, module.down, module.gate)
    wide = GatedMLP(D, 3 * I, "silu", DEVICE, F32, extra_rows=1)
    assert wide.as_shared_expert().fits(*args) and wide.as_shared_expert(gate_logit=True).fits(*args)
    assert not GatedMLP(D, I + 8, "silu", DEVICE, F32).as_shared_expert().fits(*args)
    assert not GatedMLP(D, I, "silu", DEVICE, BF16).as_shared_expert().fits(*args)
    plain = wide.as_shared_expert()
    assert not SharedExpert(plain.up, plain.down, None).fits(*args)
    assert not plain._replace(gate_logit=randn(D + 1, seed=0)).fits(*args)
    monkeypatch.setattr(experts, "runs_triton", lambda t: True)
    x = randn(3, D, seed=5)
    index, weight = routing(3, 4, 2, seed=6, dtype=F32)
    odd = GatedMLP(D, I + 8, "silu", DEVICE, F32).as_shared_expert()
    assert not module.takes_shared(x, index, odd)
    with pytest.raises(ValueError, match="takes_shared"):
        module(x, index, weight, shared=odd)


def test_a_shared_expert_of_another_shape_runs_on_its_own(monkeypatch, launches):
    """A shared expert whose width is not a multiple of the routed ones' (the tiny Qwen3-Next's 24 against
    16): the MoE's kernels take the routed experts only, and the shared expert and its gate run beside."""
    from hybridcache.models.layers import shared_moe

    moe = filled(shared_moe.SharedExpertMoE(D, 4, 2, I, I + 8, "silu", True, DEVICE, F32), seed=3)
    x = randn(3, D, seed=5)
    monkeypatch.setattr(experts, "runs_triton", lambda t: False)
    monkeypatch.setattr(routers, "runs_triton", lambda t: False)
    ref = moe(x)
    monkeypatch.setattr(experts, "runs_triton", lambda t: True)
    out = moe(x)
    assert launches == ["fused_experts_triton"]
    assert_experts_close(out, ref, F32)


@pytest.mark.parametrize("n, entry, folded", [(1, "fused_experts_triton", True), (20, "sorted_experts_triton", False),
                                              (64, "sorted_experts_triton", True)])
def test_qwen_moe_runs_its_wide_gated_shared_expert_in_the_kernels(monkeypatch, launches, n, entry, folded):
    """SharedExpertMoE with the 1B's ratio (shared expert 4 routed ones wide, a sigmoid gate row): one
    experts call holds the shared expert in the one-pair kernels and from FOLD_SORTED_FROM tokens, the
    shared expert runs on its own in between (`folds_shared`); each gives the torch path's result."""
    from hybridcache.models.layers import shared_moe

    moe = filled(shared_moe.SharedExpertMoE(D, 8, 2, I, 4 * I, "silu", True, DEVICE, BF16), seed=7)
    x = randn(n, D, seed=8, dtype=BF16)
    monkeypatch.setattr(experts, "runs_triton", lambda t: False)
    monkeypatch.setattr(routers, "runs_triton", lambda t: False)
    monkeypatch.setattr(shared_moe, "runs_triton", lambda t: False)
    ref = moe(x)
    monkeypatch.setattr(experts, "runs_triton", lambda t: True)
    index, _ = moe.gate(x)
    weights = moe.shared_expert.as_shared_expert(gate_logit=True)
    assert moe.experts.takes_shared(x, index, weights)
    assert moe.experts.folds_shared(x, index, weights) == folded
    out = moe(x)
    assert launches == [entry]
    assert_experts_close(out, ref, BF16)


def test_kimi_moe_runs_its_shared_expert_in_the_kernels(monkeypatch, launches):
    """KimiMoE with one shared expert: one experts call holds it, and gives the torch path's result."""
    moe = KimiMoE(D, 8, 2, I, 1, "silu", 1, 1, True, 2.5, DEVICE, BF16)
    filled(moe, seed=7)
    x = randn(20, D, seed=8, dtype=BF16)
    monkeypatch.setattr(experts, "runs_triton", lambda t: False)
    monkeypatch.setattr(routers, "runs_triton", lambda t: False)
    ref = moe(x)
    monkeypatch.setattr(experts, "runs_triton", lambda t: True)
    out = moe(x)
    assert launches == ["sorted_experts_triton"]
    assert_experts_close(out, ref, BF16)


def test_no_tokens():
    e = 4
    out = experts_triton.fused_experts_triton(torch.empty(0, D, device=DEVICE), torch.empty(0, 2, dtype=torch.int64,
                                              device=DEVICE), torch.empty(0, 2, device=DEVICE),
                                              randn(e, I, D, seed=0), randn(e, D, I, seed=1), None, "relu2", F32)
    assert out.shape == (0, D)
    empty = torch.empty(0, 2, dtype=torch.int64, device=DEVICE)
    order, _, ends = sort_by_expert(empty, e)
    out = experts_sorted_triton.sorted_experts_triton(torch.empty(0, D, device=DEVICE), empty,
                                                      torch.empty(0, 2, device=DEVICE), order, ends,
                                                      randn(e, I, D, seed=0), randn(e, D, I, seed=1), None,
                                                      "relu2", F32)
    assert out.shape == (0, D) and ends.tolist() == [0] * e
    index, weight = routers_triton.softmax_topk_triton(torch.empty(0, e, device=DEVICE), 2, True)
    assert index.shape == weight.shape == (0, 2)
