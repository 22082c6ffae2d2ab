"""The fused Triton decode of the gated delta rule (GDN and KDA) against the naive references.

Runs on CUDA, or on CPU tensors in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 where
there is no CUDA device); skipped otherwise. Pools are NaN except the states live rows start from, and a
padding row's inputs are NaN, so any read of a slot a row must not read, or any leak from a padding row,
shows. Every slot no live row owns (and the pool's other layer) must stay bit for bit as it was.
Tolerances: fp32 inputs 1e-5 abs / 1e-5 rel on outputs and states (the same fp32 arithmetic summed in
another order); bf16 q, k, v: states 1e-5 (fp32 math on the same bf16 values, stored in fp32), outputs
1e-2 / 1e-2 (o is rounded to bf16, whose step is 2^-8 relative, so a last-bit difference rounds apart).
"""
import pytest
import torch

from hybridcache.ops.triton_support import triton_testable
from tests.ops.delta_rule_cases import delta_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.ops.delta_rule_triton import delta_rule_decode_triton  # noqa: E402
from hybridcache.ops.gdn import RawGate, gdn_decode  # noqa: E402
from hybridcache.ops.gdn.naive import naive_gdn_decode  # noqa: E402
from hybridcache.ops.kda import KDARawGate, kda_decode  # noqa: E402
from hybridcache.ops.kda.naive import naive_kda_decode  # noqa: E402

NAN = float("nan")
# Out of order; slots 1, 2, 4 and 6 belong to no row. Row 1 starts fresh on a NaN slot. The padding row
# runs after the owner of slot 0, so a stray write of it (to slot 0, where its -1 is clamped) would stick.
SLOTS = [5, 0, -1, 3]
HAS_INITIAL = [True, False, True, True]
NUM_SLOTS = 7
NAIVE = {"gdn": naive_gdn_decode, "kda": naive_kda_decode}
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}
STATE_TOL = dict(atol=1e-5, rtol=1e-5)


def inputs(family: str, slots: list[int], T: int, H: int, HV: int, K: int, V: int, dtype: torch.dtype,
           seed: int = 0) -> list[torch.Tensor]:
    """One row per slot (B = len(slots)): q, k [B, T, H, K] and v [B, T, HV, V] in dtype; g (GDN [B, T, HV],
    KDA [B, T, H, K]) and beta [B, T, HV] fp32. Padding rows are NaN throughout."""
    g_tail = (HV,) if family == "gdn" else (H, K)
    x = delta_inputs(len(slots), T, H, HV, K, V, g_tail, dtype, seed)
    pad = torch.tensor(slots) < 0
    for t in x:
        t[pad] = NAN
    return x


def layered_pool(HV: int, K: int, V: int, slots: list[int], starts: list[bool], layer_major: bool) -> torch.Tensor:
    """A two-layer pool, [2, S, HV, K, V] (layer_major) or [S, 2, HV, K, V], NaN except layer 1's states
    of the rows in `slots` that start from them (see `layer`)."""
    pool = torch.full((2, NUM_SLOTS, HV, K, V) if layer_major else (NUM_SLOTS, 2, HV, K, V), NAN)
    ssm = layer(pool, layer_major)
    for slot, start in zip(slots, starts):
        if slot >= 0 and start:
            ssm[slot] = torch.randn(HV, K, V)
    return pool


def layer(pool: torch.Tensor, layer_major: bool) -> torch.Tensor:
    """Layer 1 of a pool as ssm [S, HV, K, V]: `pool[1]` (offset, contiguous) or `pool[:, 1]` (strided)."""
    return pool[1] if layer_major else pool[:, 1]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def run_case(family: str, T: int, H: int, HV: int, K: int, V: int, dtype: torch.dtype = torch.float32,
             slots: list[int] = SLOTS, starts: list[bool] | None = HAS_INITIAL, layer_major: bool = False,
             x: list[torch.Tensor] | None = None, block_v: int | None = None, **kw) -> None:
    """The kernel on DEVICE against the naive reference on the CPU: outputs (zeros on padding rows), live
    slots' states, and every other element of the pool bit for bit."""
    B = len(slots)
    x = inputs(family, slots, T, H, HV, K, V, dtype) if x is None else x
    pool = layered_pool(HV, K, V, slots, starts or [True] * B, layer_major)
    slot_t = torch.tensor(slots)
    init = None if starts is None else torch.tensor(starts)
    ref = pool.clone()
    o_ref = NAIVE[family](*x, layer(ref, layer_major), slot_t, init, use_qk_l2norm_in_kernel=True, **kw)
    fast = pool.to(DEVICE)
    o = delta_rule_decode_triton(*(t.to(DEVICE) for t in x), layer(fast, layer_major), slot_t.to(DEVICE),
                                 None if init is None else init.to(DEVICE), use_qk_l2norm_in_kernel=True,
                                 block_v=block_v, **kw)
    assert o.dtype == dtype and o.shape == (B, T, HV, V)
    o, fast = o.cpu(), fast.cpu()
    live = slot_t >= 0
    torch.testing.assert_close(o[live], o_ref[live], **TOL[dtype])
    assert torch.equal(o[~live], torch.zeros_like(o[~live]))
    owned = slot_t[live]
    torch.testing.assert_close(layer(fast, layer_major)[owned], layer(ref, layer_major)[owned], **STATE_TOL)
    untouched = torch.ones(pool.shape, dtype=torch.bool)
    layer(untouched, layer_major)[owned] = False
    assert same_bits(fast[untouched], pool[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("family,H,HV", [("gdn", 2, 2), ("gdn", 2, 4), ("gdn", 1, 3), ("kda", 2, 2)],
                         ids=["gdn", "gdn-grouped2", "gdn-grouped3", "kda"])
def test_matches_naive(family: str, H: int, HV: int, T: int, dtype: torch.dtype) -> None:
    """K != V; mixed fresh and continued rows; slots out of order with a padding row; a strided pool view."""
    run_case(family, T, H, HV, 16, 32, dtype)


@pytest.mark.parametrize("family,H,HV", [("gdn", 1, 2), ("kda", 2, 2)], ids=["gdn", "kda"])
@pytest.mark.parametrize("K,V", [(24, 24), (16, 24), (24, 8)])
def test_dims_that_are_not_powers_of_two(family: str, H: int, HV: int, K: int, V: int) -> None:
    """K pads to a masked 32-row tile; V = 24 with 16 columns a program leaves the second block half empty."""
    run_case(family, 3, H, HV, K, V, block_v=16)


@pytest.mark.parametrize("block_v", [8, 64])
def test_block_v_does_not_change_the_result(block_v: int) -> None:
    """Four value blocks of a head, or one block wider than V (half its columns masked)."""
    run_case("gdn", 2, 2, 4, 16, 32, block_v=block_v)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_layer_major_pool_no_has_initial_and_explicit_scale(family: str) -> None:
    """ssm = pool[layer] of [L, S, HV, K, V]; has_initial None (every live row reads its slot); scale given."""
    run_case(family, 2, 2, 2, 16, 16, starts=None, layer_major=True, scale=0.3)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_strided_inputs(family: str) -> None:
    """q, k and KDA's g as slices of wider tensors (unit last stride, read in place), v transposed (copied),
    beta and GDN's g with no unit stride at all: the same result as contiguous inputs."""
    T, H, K, V = 2, 2, 16, 16
    q, k, v, g, beta = inputs(family, SLOTS, T, H, H, K, V, torch.float32, seed=1)
    qk = torch.cat([q, k], dim=-1)  # [B, T, H, 2K]
    vt = v.transpose(-1, -2).contiguous().transpose(-1, -2)  # last stride H
    bg = torch.stack([beta, torch.zeros_like(beta)], dim=-1)[..., 0]  # last stride 2
    if family == "gdn":
        gs = torch.stack([g, torch.zeros_like(g)], dim=-1)[..., 0]
    else:
        gs = torch.cat([g, torch.zeros_like(g)], dim=-1)[..., :K]
    strided = [qk[..., :K], qk[..., K:], vt, gs, bg]
    assert not any(t.is_contiguous() for t in strided)
    run_case(family, T, H, H, K, V, x=strided)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_all_padding_rows_write_nothing(family: str) -> None:
    run_case(family, 2, 2, 2, 16, 16, slots=[-1, -1], starts=[True, False])


def test_empty_batch() -> None:
    x = [t.to(DEVICE) for t in inputs("gdn", [0, 1], 1, 2, 2, 16, 16, torch.float32)]
    ssm = torch.zeros(3, 2, 16, 16, device=DEVICE)
    o = delta_rule_decode_triton(*(t[:0] for t in x), ssm, torch.zeros(0, dtype=torch.long, device=DEVICE))
    assert o.shape == (0, 1, 2, 16)


@pytest.mark.skipif(DEVICE != "cuda", reason="the dispatch and sync checks need CUDA")
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_decode_dispatches_to_the_kernel_without_host_sync(family: str) -> None:
    decode = gdn_decode if family == "gdn" else kda_decode
    x = [t.cuda() for t in inputs(family, SLOTS, 2, 2, 4 if family == "gdn" else 2, 32, 32, torch.bfloat16)]
    ssm = torch.randn(NUM_SLOTS, x[2].shape[2], 32, 32, device="cuda")
    slots, init = torch.tensor(SLOTS, device="cuda"), torch.tensor(HAS_INITIAL, device="cuda")
    want_ssm = ssm.clone()
    want = delta_rule_decode_triton(*x, want_ssm, slots, init)  # also compiles outside the sync check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = decode(*x, ssm, slots, init)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got, want) and torch.equal(ssm, want_ssm)


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_intermediate_states_are_the_states_after_each_token(family):
    """`intermediate=` (the per-token-states alternative to replay, benchmarks only): the same outputs as a
    plain decode, the state after token t in inter[slot, t] (the naive decode of tokens [0, t]), ssm unread
    past the start and unwritten."""
    T, H, HV, K, V = 3, 2, 2 if family == "kda" else 4, 16, 16
    slots = [5, 0, -1, 3]
    x = inputs(family, slots, T, H, HV, K, V, torch.float32)
    pool = layered_pool(HV, K, V, slots, [True] * 4, layer_major=True)
    before = pool.clone()
    inter = torch.full((NUM_SLOTS, T, HV, K, V), NAN)
    slot_t = torch.tensor(slots)
    dev = [t.to(DEVICE) for t in x]
    pool_d, inter_d = pool.to(DEVICE, copy=True), inter.to(DEVICE, copy=True)
    o = delta_rule_decode_triton(*dev, layer(pool_d, True), slot_t.to(DEVICE), use_qk_l2norm_in_kernel=True,
                                 intermediate=inter_d)
    assert same_bits(pool_d.cpu(), before), "ssm must not be written"
    for t in range(T):
        ref_pool = before.clone()
        o_ref = NAIVE[family](*(y[:, : t + 1] for y in x), layer(ref_pool, True), slot_t,
                              use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(o.cpu()[[0, 1, 3], t], o_ref[[0, 1, 3], t], **TOL[torch.float32])
        for row in (0, 1, 3):
            torch.testing.assert_close(inter_d.cpu()[slots[row], t], layer(ref_pool, True)[slots[row]], **STATE_TOL)
    untouched = [s for s in range(NUM_SLOTS) if s not in slots]
    assert torch.isnan(inter_d.cpu()[untouched]).all()


# Raw gate (GDN): the kernel computes g = -exp(A_log)·softplus(a + dt_bias) and beta = sigmoid(b) itself

def raw_gate(slots: list[int], T: int, HV: int, dtype: torch.dtype, seed: int = 0) -> RawGate:
    """a, b [B, T, HV] as column slices of one [B, T, 2HV] projection output (b first, as the mixer's), in
    dtype, NaN on padding rows; A_log, dt_bias [HV] in dtype. a + dt_bias spans softplus's branches: over its
    threshold 20 (token 0 of head 0) and so negative that 1 + exp(x) rounds to 1 (the last token's last head)."""
    gen = torch.Generator().manual_seed(seed)
    ba = torch.randn(len(slots), T, 2 * HV, generator=gen) * 3
    ba[:, 0, HV] = 25.0
    ba[:, -1, -1] = -40.0
    ba[torch.tensor(slots) < 0] = NAN
    ba = ba.to(dtype)
    A_log, dt_bias = (torch.randn(HV, generator=gen).to(dtype) for _ in range(2))
    return RawGate(ba[..., HV:], ba[..., :HV], A_log, dt_bias)


def on(gate: RawGate, device: str) -> RawGate:
    """The gate on `device`, a and b still column slices of one tensor."""
    ba = torch.cat([gate.b, gate.a], dim=-1).to(device)
    return RawGate(ba[..., gate.a.shape[-1]:], ba[..., :gate.a.shape[-1]], gate.A_log.to(device),
                   gate.dt_bias.to(device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("H,HV", [(2, 2), (2, 4), (1, 3)], ids=["gdn", "gdn-grouped2", "gdn-grouped3"])
def test_raw_gate_matches_precomputed_gate(H: int, HV: int, T: int, dtype: torch.dtype) -> None:
    """`gate=RawGate(...)` against g, beta = `gdn_gate` passed in: the same kernel's outputs and states within
    the tolerances above, padding rows (NaN a, b) zeros, every other element of the pool as it was; and against
    the naive reference (run_case)."""
    K, V = 16, 32
    q, k, v, _, _ = inputs("gdn", SLOTS, T, H, HV, K, V, dtype)
    gate = raw_gate(SLOTS, T, HV, dtype)
    assert not gate.a.is_contiguous() and gate.a.stride(-1) == 1  # read in place
    g, beta = gate.values()
    assert g.dtype == torch.float32 and beta.dtype == dtype
    assert (g[:, 0, 0][torch.tensor(SLOTS) >= 0] < -10).all()  # the threshold branch was taken
    run_case("gdn", T, H, HV, K, V, dtype, x=[q, k, v, g, beta])  # precomputed vs naive

    pool = layered_pool(HV, K, V, SLOTS, HAS_INITIAL, layer_major=False)
    slot_t, init = torch.tensor(SLOTS, device=DEVICE), torch.tensor(HAS_INITIAL, device=DEVICE)
    dev = [t.to(DEVICE) for t in (q, k, v)]
    pre, raw = pool.to(DEVICE, copy=True), pool.to(DEVICE, copy=True)
    o_pre = delta_rule_decode_triton(*dev, g.to(DEVICE), beta.to(DEVICE), layer(pre, False), slot_t, init,
                                     use_qk_l2norm_in_kernel=True)
    o_raw = delta_rule_decode_triton(*dev, None, None, layer(raw, False), slot_t, init, use_qk_l2norm_in_kernel=True,
                                     gate=on(gate, DEVICE))
    live = torch.tensor(SLOTS) >= 0
    o_pre, o_raw, pre, raw = o_pre.cpu(), o_raw.cpu(), pre.cpu(), raw.cpu()
    torch.testing.assert_close(o_raw[live], o_pre[live], **TOL[dtype])
    assert torch.equal(o_raw[~live], torch.zeros_like(o_raw[~live]))
    owned = torch.tensor(SLOTS)[live]
    torch.testing.assert_close(layer(raw, False)[owned], layer(pre, False)[owned], **STATE_TOL)
    untouched = torch.ones(pool.shape, dtype=torch.bool)
    layer(untouched, False)[owned] = False
    assert same_bits(raw[untouched], pool[untouched])


def kda_raw_gate(slots: list[int], T: int, H: int, K: int, dtype: torch.dtype, seed: int = 0) -> KDARawGate:
    """g_raw [B, T, H, K] (a view of one [B, T, H·K] projection output) and b [B, T, H] in dtype, NaN on padding
    rows; A_log [1, 1, H, 1] in dtype and dt_bias [H·K] fp32, as the mixer's parameters. g_raw + dt_bias spans
    softplus's branches: over its threshold 20 (channel 0 of token 0) and so negative that 1 + exp(x) rounds to
    1 (the last channel of the last token)."""
    gen = torch.Generator().manual_seed(seed)
    g_raw = torch.randn(len(slots), T, H * K, generator=gen) * 3
    g_raw.view(len(slots), T, H, K)[:, 0, :, 0] = 25.0
    g_raw.view(len(slots), T, H, K)[:, -1, :, -1] = -40.0
    b = torch.randn(len(slots), T, H, generator=gen) * 3
    pad = torch.tensor(slots) < 0
    g_raw[pad], b[pad] = NAN, NAN
    return KDARawGate(g_raw.to(dtype).view(len(slots), T, H, K), b.to(dtype),
                      torch.randn(1, 1, H, 1, generator=gen).to(dtype), torch.randn(H * K, generator=gen))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 4])
def test_kda_raw_gate_matches_precomputed_gate(T: int, dtype: torch.dtype) -> None:
    """`gate=KDARawGate(...)` against g, beta = `gate.values()` passed in: the same kernel's outputs and states
    within the tolerances above, padding rows (NaN g_raw, b) zeros, every other element of the pool as it was;
    and against the naive reference (run_case)."""
    H, K, V = 2, 16, 32
    q, k, v, _, _ = inputs("kda", SLOTS, T, H, H, K, V, dtype)
    gate = kda_raw_gate(SLOTS, T, H, K, dtype)
    g, beta = gate.values()
    live = torch.tensor(SLOTS) >= 0
    assert g.dtype == torch.float32 and beta.dtype == dtype
    assert (g[live][:, -1, :, -1] == 0).all() and (g[live][:, 0, :, 0] < -1).all()  # both softplus edges
    run_case("kda", T, H, H, K, V, dtype, x=[q, k, v, g, beta])  # precomputed vs naive

    pool = layered_pool(H, K, V, SLOTS, HAS_INITIAL, layer_major=False)
    slot_t, init = torch.tensor(SLOTS, device=DEVICE), torch.tensor(HAS_INITIAL, device=DEVICE)
    dev = [t.to(DEVICE) for t in (q, k, v)]
    pre, raw = pool.to(DEVICE, copy=True), pool.to(DEVICE, copy=True)
    o_pre = delta_rule_decode_triton(*dev, g.to(DEVICE), beta.to(DEVICE), layer(pre, False), slot_t, init,
                                     use_qk_l2norm_in_kernel=True)
    o_raw = delta_rule_decode_triton(*dev, None, None, layer(raw, False), slot_t, init, use_qk_l2norm_in_kernel=True,
                                     gate=KDARawGate(*(t.to(DEVICE) for t in gate)))
    o_pre, o_raw, pre, raw = o_pre.cpu(), o_raw.cpu(), pre.cpu(), raw.cpu()
    torch.testing.assert_close(o_raw[live], o_pre[live], **TOL[dtype])
    assert torch.equal(o_raw[~live], torch.zeros_like(o_raw[~live]))
    owned = torch.tensor(SLOTS)[live]
    torch.testing.assert_close(layer(raw, False)[owned], layer(pre, False)[owned], **STATE_TOL)
    untouched = torch.ones(pool.shape, dtype=torch.bool)
    layer(untouched, False)[owned] = False
    assert same_bits(raw[untouched], pool[untouched])


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_decode_takes_a_raw_gate_on_every_path(family: str) -> None:
    """The op: `gate=` equals g, beta = gate.values() bit for bit on the torch path (CPU) and, where the kernel
    runs, within the tolerances; g, beta and gate together are refused."""
    T, H, K, V = 2, 2, 16, 16
    HV = 4 if family == "gdn" else H
    decode = gdn_decode if family == "gdn" else kda_decode
    q, k, v, _, _ = inputs(family, SLOTS, T, H, HV, K, V, torch.float32, seed=2)
    gate = (raw_gate(SLOTS, T, HV, torch.float32, seed=2) if family == "gdn"
            else kda_raw_gate(SLOTS, T, H, K, torch.float32, seed=2))
    g, beta = gate.values()
    slots, init = torch.tensor(SLOTS), torch.tensor(HAS_INITIAL)
    pool = torch.randn(NUM_SLOTS, HV, K, V)
    a, b = pool.clone(), pool.clone()
    want = decode(q, k, v, g, beta, a, slots, init, use_qk_l2norm_in_kernel=True)
    got = decode(q, k, v, None, None, b, slots, init, use_qk_l2norm_in_kernel=True, gate=gate)
    exact = dict(rtol=0, atol=0, equal_nan=True)  # padding rows: NaN in, NaN out on the torch path
    torch.testing.assert_close(got, want, **exact)
    torch.testing.assert_close(b, a, **exact)
    with pytest.raises(AssertionError, match="not both"):
        decode(q, k, v, g, beta, b, slots, init, gate=gate)
    if DEVICE == "cuda":
        c = pool.cuda()
        o = decode(q.cuda(), k.cuda(), v.cuda(), None, None, c, slots.cuda(), init.cuda(),
                   use_qk_l2norm_in_kernel=True, gate=type(gate)(*(t.cuda() for t in gate)))
        live = slots >= 0
        torch.testing.assert_close(o.cpu()[live], want[live], **TOL[torch.float32])
        torch.testing.assert_close(c.cpu(), a, **STATE_TOL)
