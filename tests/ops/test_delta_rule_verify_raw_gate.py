"""Triton verify kernels given a raw gate (the kernels compute g and beta from the projection's outputs) and
strided inputs read in place, against the same kernels given precomputed g and beta, and the torch paths.

Pools, slots, NaN fill and tolerances as in tests/ops/test_delta_rule_verify_triton.py, whose helpers these
tests use.
"""
import pytest
import torch

from hybridcache.ops.gdn import RawGate, gdn_verify
from hybridcache.ops.gdn.naive import naive_gdn_verify
from hybridcache.ops.kda import KDARawGate, kda_verify
from hybridcache.ops.kda.naive import naive_kda_verify
from hybridcache.ops.triton_support import HAS_TRITON, interpreting, triton_testable

if not HAS_TRITON:
    pytest.skip("triton is not installed", allow_module_level=True)
if not triton_testable(torch.empty(0, device="cpu" if interpreting() or not torch.cuda.is_available() else "cuda")):
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 for Triton's CPU interpreter", allow_module_level=True)

from hybridcache.ops.gdn.triton_verify import gdn_verify_triton  # noqa: E402
from hybridcache.ops.kda.triton_verify import kda_verify_triton  # noqa: E402
from tests.ops.test_delta_rule_verify_triton import (  # noqa: E402
    DEVICE, H, HV, LIVE, NAN, SLOTS, check_outputs, check_roles, copies,
    gdn_pools, gdn_run, gdn_written, kda_pools, kda_run, kda_written, qk_inputs)
from tests.ops.test_delta_rule_verify_triton import kda_form  # noqa: E402, F401 (a fixture)
from tests.ops.delta_rule_cases import dtype_tol  # noqa: E402


# GDN with a raw gate (the kernel computes g and beta from the projection's a, b) and strided inputs

def raw_gate(B: int, T: int, dtype, seed: int) -> RawGate:
    """a, b [B, T, HV] as column slices of one [B, T, 2HV] tensor (b first, as the mixer's projection), in dtype,
    NaN on padding rows; A_log, dt_bias [HV] in dtype. Token 0 of head 0 takes softplus's threshold branch."""
    gen = torch.Generator().manual_seed(seed)
    ba = torch.randn(B, T, 2 * HV, generator=gen) * 3
    ba[:, 0, HV] = 25.0
    ba[~LIVE] = NAN
    ba = ba.to(dtype)
    return RawGate(ba[..., HV:], ba[..., :HV], *(torch.randn(HV, generator=gen).to(dtype) for _ in range(2)))


def gate_on(gate: RawGate, device: str) -> RawGate:
    ba = torch.cat([gate.b, gate.a], dim=-1).to(device)
    return RawGate(ba[..., HV:], ba[..., :HV], gate.A_log.to(device), gate.dt_bias.to(device))


@pytest.mark.parametrize("T,hist,K,V,dtype", [(1, 8, 16, 8, torch.float32), (4, 20, 32, 40, torch.float32),
                                              (2, 5, 16, 8, torch.bfloat16), (4, 8, 16, 8, torch.bfloat16)])
def test_gdn_verify_raw_gate_matches_precomputed(T, hist, K, V, dtype):
    """`gate=RawGate(...)` against g, beta = gate.values() passed in, on rows that fold and rows that append:
    outputs, ssm and every history role (the G and β entries included) as the kernel with the precomputed
    gate and the naive reference write them, within the tolerances above; nothing else written."""
    before = gdn_pools(T, hist, K, V, dtype)
    ref, pre, raw = copies(before), copies(before, DEVICE), copies(before, DEVICE)
    q, k, v, _, _ = qk_inputs(len(SLOTS), T, HV, K, V, (HV,), dtype, seed=T, norm_in_kernel=True)
    gate = raw_gate(len(SLOTS), T, dtype, seed=T)
    g, beta = gate.values()
    assert g.dtype == torch.float32 and beta.dtype == dtype
    slots = torch.tensor(SLOTS)
    kw = dict(use_qk_l2norm_in_kernel=True)
    o_ref = gdn_run(naive_gdn_verify, [q, k, v, g, beta], ref, slots, **kw)
    dev = [t.to(DEVICE) for t in (q, k, v)]
    o_pre = gdn_run(gdn_verify_triton, [*dev, g.to(DEVICE), beta.to(DEVICE)], pre, slots.to(DEVICE), **kw)
    o_raw = gdn_run(gdn_verify_triton, [*dev, None, None], raw, slots.to(DEVICE), gate=gate_on(gate, DEVICE), **kw)
    check_outputs(o_raw, o_ref, o_pre, dtype_tol(dtype))
    written = gdn_written(before, T, hist)
    assert written["ssm"].any() and not written["ssm"].all()  # both folding and appending rows
    role_tol = lambda r: dtype_tol(dtype if r in ("replay_u", "replay_k") else torch.float32)  # noqa: E731
    check_roles(raw, ref, before, written, role_tol)
    check_roles(raw, {r: t.cpu() for r, t in pre.items()}, before, written, role_tol)
    for r in ("pnat", "buf_idx"):  # read only
        assert torch.equal(raw[r].cpu(), before[r])


def assert_views_read_in_place(run, kernel, x: list[torch.Tensor], views: list[torch.Tensor], before) -> None:
    """The kernel on strided views of one packed projection gives the contiguous inputs' outputs and pools,
    bit for bit."""
    assert not any(t.is_contiguous() for t in views)
    a, b = copies(before, DEVICE), copies(before, DEVICE)
    slots = torch.tensor(SLOTS, device=DEVICE)
    o_a = run(kernel, [t.to(DEVICE) for t in x], a, slots, use_qk_l2norm_in_kernel=True)
    o_b = run(kernel, [t.to(DEVICE) for t in views], b, slots, use_qk_l2norm_in_kernel=True)
    assert torch.equal(o_a, o_b)
    for r in a:
        torch.testing.assert_close(b[r], a[r], rtol=0, atol=0, equal_nan=True, msg=lambda s: f"{r}: {s}")


def test_gdn_verify_reads_strided_inputs_in_place():
    """q, k, v as column slices of one conv output [B, T, 2HK + HV·V] and g, beta as slices of a wider tensor:
    the same writes and outputs, bit for bit, as contiguous copies."""
    T, hist, K, V = 3, 8, 16, 8
    before = gdn_pools(T, hist, K, V, torch.float32)
    x = qk_inputs(len(SLOTS), T, HV, K, V, (HV,), torch.float32, seed=4, norm_in_kernel=True)
    q, k, v, g, beta = x
    qkv = torch.cat([t.flatten(2) for t in (q, k, v)], dim=-1)  # [B, T, C]
    gb = torch.cat([g, beta], dim=-1)
    hk = H * K
    views = [qkv[..., :hk].unflatten(-1, (H, K)), qkv[..., hk:2 * hk].unflatten(-1, (H, K)),
             qkv[..., 2 * hk:].unflatten(-1, (HV, V)), gb[..., :HV], gb[..., HV:]]
    assert_views_read_in_place(gdn_run, gdn_verify_triton, x, views, before)


def test_gdn_verify_takes_a_raw_gate_on_the_torch_path():
    """The op on CPU tensors (the torch path): `gate=` equals g, beta = gate.values() bit for bit."""
    T, hist, K, V = 2, 8, 16, 8
    before = gdn_pools(T, hist, K, V, torch.float32)
    q, k, v, _, _ = qk_inputs(len(SLOTS), T, HV, K, V, (HV,), torch.float32, seed=5, norm_in_kernel=True)
    gate = raw_gate(len(SLOTS), T, torch.float32, seed=5)
    a, b = copies(before), copies(before)
    slots = torch.tensor(SLOTS)
    o_a = gdn_run(gdn_verify, [q, k, v, *gate.values()], a, slots, use_qk_l2norm_in_kernel=True)
    o_b = gdn_run(gdn_verify, [q, k, v, None, None], b, slots, use_qk_l2norm_in_kernel=True, gate=gate)
    exact = dict(rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(o_b[LIVE], o_a[LIVE], **exact)
    for r in a:
        torch.testing.assert_close(b[r], a[r], **exact)


# KDA with a raw gate (the kernels compute g = kda_gate(g_raw, A_log, dt_bias) and beta = sigmoid(b))

def kda_raw_gate(B: int, T: int, K: int, dtype, seed: int) -> KDARawGate:
    """g_raw [B, T, H, K] and b [B, T, H] in dtype, NaN on padding rows; A_log [1, 1, H, 1] in dtype, dt_bias
    [H·K] fp32 (the mixer's parameters). g_raw + dt_bias spans softplus's branches: over its threshold 20 (key
    channel 0 of token 0) and so negative that 1 + exp(x) rounds to 1 (the last channel of the last token)."""
    gen = torch.Generator().manual_seed(seed)
    g_raw = torch.randn(B, T, H, K, generator=gen) * 3
    g_raw[:, 0, :, 0] = 25.0
    g_raw[:, -1, :, -1] = -40.0
    b = torch.randn(B, T, H, generator=gen) * 3
    g_raw[~LIVE], b[~LIVE] = NAN, NAN
    return KDARawGate(g_raw.to(dtype), b.to(dtype), torch.randn(1, 1, H, 1, generator=gen).to(dtype),
                      torch.randn(H * K, generator=gen))


def kda_gate_on(gate: KDARawGate, device: str) -> KDARawGate:
    return KDARawGate(*(t.to(device) for t in gate))


@pytest.mark.parametrize("T,P,K,V,dtype", [(1, 3, 16, 8, torch.float32), (4, 4, 32, 40, torch.float32),
                                           (2, 3, 16, 8, torch.bfloat16), (4, 3, 16, 8, torch.bfloat16)])
def test_kda_verify_raw_gate_matches_precomputed(T, P, K, V, dtype, kda_form):
    """`gate=KDARawGate(...)` against g, beta = gate.values() passed in, rows with pend_n 0, 1, P - 1 and P:
    outputs, ssm and every pending role (pend_g and pend_beta, which the second launch computes from the raw
    gate, included) as the kernels with the precomputed gate and the naive reference write them, within the
    tolerances above; nothing else written."""
    before = kda_pools(P, K, V, dtype)
    ref, pre, raw = copies(before), copies(before, DEVICE), copies(before, DEVICE)
    q, k, v, _, _ = qk_inputs(len(SLOTS), T, H, K, V, (H, K), dtype, seed=T, norm_in_kernel=True)
    gate = kda_raw_gate(len(SLOTS), T, K, dtype, seed=T)
    g, beta = gate.values()
    assert g.dtype == torch.float32 and beta.dtype == dtype
    assert (g[LIVE][:, -1, :, -1] == 0).all() and (g[LIVE][:, 0, :, 0] < -1).all()  # both softplus edges
    slots = torch.tensor(SLOTS)
    kw = dict(use_qk_l2norm_in_kernel=True)
    o_ref = kda_run(naive_kda_verify, [q, k, v, g, beta], ref, slots, **kw)
    dev = [t.to(DEVICE) for t in (q, k, v)]
    o_pre = kda_run(kda_verify_triton, [*dev, g.to(DEVICE), beta.to(DEVICE)], pre, slots.to(DEVICE), **kw)
    o_raw = kda_run(kda_verify_triton, [*dev, None, None], raw, slots.to(DEVICE), gate=kda_gate_on(gate, DEVICE), **kw)
    check_outputs(o_raw, o_ref, o_pre, dtype_tol(dtype))
    written = kda_written(before, T)
    role_tol = lambda r: dtype_tol(dtype if r in ("pend_k", "pend_v") else torch.float32)  # noqa: E731
    check_roles(raw, ref, before, written, role_tol)
    check_roles(raw, {r: t.cpu() for r, t in pre.items()}, before, written, role_tol)
    if T > 1 and dtype != torch.float32:  # beta rounded to b's dtype as sigmoid(b) returns it: the same values
        # (in fp32 Triton's exp may differ from torch's by an ulp; rounding to bf16 absorbs it here)
        live = torch.tensor([s for s in SLOTS if s >= 0])
        assert torch.equal(raw["pend_beta"].cpu()[live, :T - 1], beta[LIVE][:, 1:].float())
    assert torch.equal(raw["pend_n"].cpu(), before["pend_n"])  # read only


def test_kda_verify_reads_strided_inputs_in_place(kda_form):
    """q, k, v as column slices of one conv output [B, T, 3HK] (as the KDA mixer passes them) and g, beta
    as slices of a wider tensor: the same writes and outputs, bit for bit, as contiguous copies."""
    T, P, K, V = 3, 3, 16, 16
    before = kda_pools(P, K, V, torch.float32)
    x = qk_inputs(len(SLOTS), T, H, K, V, (H, K), torch.float32, seed=5, norm_in_kernel=True)
    q, k, v, g, beta = x
    qkv = torch.cat([t.flatten(2) for t in (q, k, v)], dim=-1)  # [B, T, 3HK]
    gb = torch.cat([g.flatten(2), beta], dim=-1)
    hk = H * K
    views = [qkv[..., :hk].unflatten(-1, (H, K)), qkv[..., hk:2 * hk].unflatten(-1, (H, K)),
             qkv[..., 2 * hk:].unflatten(-1, (H, V)), gb[..., :hk].unflatten(-1, (H, K)), gb[..., hk:]]
    assert_views_read_in_place(kda_run, kda_verify_triton, x, views, before)


def test_kda_verify_takes_a_raw_gate_on_the_torch_path():
    """The op on CPU tensors (the torch path): `gate=` equals g, beta = gate.values() bit for bit; g, beta and
    gate together are refused."""
    T, P, K, V = 3, 3, 16, 8
    before = kda_pools(P, K, V, torch.float32)
    q, k, v, _, _ = qk_inputs(len(SLOTS), T, H, K, V, (H, K), torch.float32, seed=5, norm_in_kernel=True)
    gate = kda_raw_gate(len(SLOTS), T, K, torch.float32, seed=5)
    a, b = copies(before), copies(before)
    slots = torch.tensor(SLOTS)
    o_a = kda_run(kda_verify, [q, k, v, *gate.values()], a, slots, use_qk_l2norm_in_kernel=True)
    o_b = kda_run(kda_verify, [q, k, v, None, None], b, slots, use_qk_l2norm_in_kernel=True, gate=gate)
    exact = dict(rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(o_b[LIVE], o_a[LIVE], **exact)
    for r in a:
        torch.testing.assert_close(b[r], a[r], **exact)
    with pytest.raises(AssertionError, match="not both"):
        kda_run(kda_verify, [q, k, v, *gate.values()], b, slots, gate=gate)
