"""Triton verify kernels (GDN replay, KDA pending drafts) vs the torch paths and the naive references.

Runs on CUDA, or on CPU tensors in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 when there
is no CUDA device); skipped when triton does not import or neither applies.
Pools are strided views (a layer of a pool with padded rows) filled with NaN wherever a row must not read:
slots of no row, the other history buffer, history entries at or past p, pending drafts at or past pend_n.
Each step checks the outputs of live rows (padding rows: zeros), every role where the step writes, and every
other element bit for bit (NaN included).
Tolerances: fp32 2e-4 (as tests/ops/delta_rule_cases; recurrent vs closed form, fp32 throughout);
bf16 inputs 2e-2 on outputs and on bf16 roles (one bf16 rounding of a value computed in fp32), 2e-4 on the
fp32 roles (ssm, G, g, beta: fp32 arithmetic on the same bf16-rounded inputs).
"""

import pytest
import torch

from hybridcache.ops.gdn import gdn_accept, gdn_verify
from hybridcache.ops.gdn.naive import naive_gdn_verify
from hybridcache.ops.kda import kda_accept, kda_verify
from hybridcache.ops.kda.naive import naive_kda_verify
from hybridcache.ops.triton_support import HAS_TRITON, interpreting, triton_testable
from tests.ops.delta_rule_cases import close, delta_inputs, dtype_tol

if not HAS_TRITON:
    pytest.skip("triton is not installed", allow_module_level=True)
DEVICE = "cpu" if interpreting() or not torch.cuda.is_available() else "cuda"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 for Triton's CPU interpreter", allow_module_level=True)

from hybridcache.ops.gdn.triton_verify import gdn_verify_triton  # noqa: E402
from hybridcache.ops.kda import triton_verify as kda_triton_verify  # noqa: E402
from hybridcache.ops.kda.triton_verify import kda_verify_triton  # noqa: E402

NAN = float("nan")
S, H, HV = 8, 2, 4  # GDN: grouped heads, two value heads a key head
GDN_ROLES = ["ssm", "replay_u", "replay_k", "replay_G", "replay_beta"]
KDA_ROLES = ["ssm", "pend_k", "pend_g", "pend_v", "pend_beta"]
SLOTS = [6, 2, -1, 0, 5, 3]  # out of order; slots 1, 4 and 7 belong to no row and hold only NaN
LIVE = torch.tensor(SLOTS) >= 0


def strided(*shape: int, dtype=torch.float32, fill: float = NAN, device: str = "cpu") -> torch.Tensor:
    """Layer 1 of a two-layer pool whose rows are padded by 3 elements: an offset view in which no stride but
    the last is the contiguous one (1-D roles: every other element)."""
    if len(shape) == 1:
        return torch.full((2, 2 * shape[0]), fill, dtype=dtype, device=device)[1, ::2]
    return torch.full((2, *shape[:-1], shape[-1] + 3), fill, dtype=dtype, device=device)[1, ..., :shape[-1]]


def copies(p: dict, device: str = "cpu") -> dict:
    """Copies in the same strided layout."""
    return {r: strided(*t.shape, dtype=t.dtype, fill=0, device=device).copy_(t) for r, t in p.items()}


def check_roles(got: dict, want: dict, before: dict, written: dict, tol) -> None:
    """Where `written` is true: close to the reference; elsewhere bit for bit as before (NaN == NaN)."""
    for r, m in written.items():
        g, w, b = got[r].cpu(), want[r], before[r]
        assert not g[m].isnan().any(), r
        close(g[m], w[m], tol(r))
        torch.testing.assert_close(g[~m], b[~m], rtol=0, atol=0, equal_nan=True, msg=lambda s: f"{r}: {s}")
        torch.testing.assert_close(w[~m], b[~m], rtol=0, atol=0, equal_nan=True)  # the mask is the reference's


def check_outputs(o, o_ref, o_torch, tol) -> None:
    o = o.cpu()
    close(o[LIVE], o_ref[LIVE], tol)
    close(o[LIVE], o_torch[LIVE].cpu(), tol)
    assert torch.equal(o[~LIVE], torch.zeros_like(o[~LIVE]))  # padding rows output zeros


def qk_inputs(B, T, HV, K, V, g_tail, dtype, seed, norm_in_kernel):
    """`delta_inputs`, with q and k normalised here when the kernel will not."""
    x = delta_inputs(B, T, H, HV, K, V, g_tail, dtype, seed)
    if not norm_in_kernel:  # the caller normalised q and k
        x[:2] = [torch.nn.functional.normalize(t.float(), dim=-1).to(dtype) for t in x[:2]]
    return x


# Gated DeltaNet: p per row of SLOTS (None: padding)

def gdn_pools(T: int, hist: int, K: int, V: int, dtype, seed: int = 0) -> dict:
    """Rows fold (p = HIST - T + 1, p = HIST) and append (p = 0, p = HIST - T, a middle p); valid history is
    random, everything a row must not read is NaN."""
    gen = torch.Generator().manual_seed(seed)
    p = {
        "ssm": strided(S, HV, K, V),
        "replay_u": strided(S, 2, hist, HV, V, dtype=dtype),
        "replay_k": strided(S, 2, hist, H, K, dtype=dtype),
        "replay_G": strided(S, 2, HV, hist),
        "replay_beta": strided(S, 2, HV, hist),
        "pnat": strided(S, dtype=torch.int32, fill=hist + 3),  # garbage where no row reads it
        "buf_idx": strided(S, dtype=torch.int32, fill=7),
    }
    pn = [hist - T + 1, 0, None, hist - T, hist, min(hist - T, 3)]
    for slot, n in zip(SLOTS, pn):
        if slot < 0:
            continue
        b = int(torch.randint(0, 2, (1,), generator=gen))
        p["pnat"][slot], p["buf_idx"][slot] = n, b
        p["ssm"][slot] = torch.randn(HV, K, V, generator=gen) * 0.5
        keys = torch.nn.functional.normalize(torch.randn(n, H, K, generator=gen), dim=-1)
        p["replay_k"][slot, b, :n] = keys.to(dtype)
        p["replay_u"][slot, b, :n] = (torch.randn(n, HV, V, generator=gen) * 0.5).to(dtype)
        p["replay_G"][slot, b, :, :n] = (-0.3 * torch.rand(HV, n, generator=gen)).cumsum(-1)
        p["replay_beta"][slot, b, :, :n] = torch.rand(HV, n, generator=gen)
    return p


def gdn_written(p: dict, T: int, hist: int) -> dict:
    """Where a verify step writes: ssm of folding rows; history [p, p + T) of buffer b, or [0, T) of 1 - b."""
    m = {r: torch.zeros(p[r].shape, dtype=torch.bool) for r in GDN_ROLES}
    for slot in SLOTS:
        if slot < 0:
            continue
        n, b = int(p["pnat"][slot]), int(p["buf_idx"][slot])
        fold = n + T > hist
        m["ssm"][slot] = fold
        buf, pos = (1 - b, slice(0, T)) if fold else (b, slice(n, n + T))
        m["replay_u"][slot, buf, pos] = m["replay_k"][slot, buf, pos] = True
        m["replay_G"][slot, buf, :, pos] = m["replay_beta"][slot, buf, :, pos] = True
    return m


def gdn_run(fn, x, p: dict, slots: torch.Tensor, **kw) -> torch.Tensor:
    return fn(*x, *(p[r] for r in GDN_ROLES), p["pnat"], p["buf_idx"], slots, **kw)


GDN_CASES = [  # T, HIST, K, V, dtype, l2norm in kernel
    (1, 8, 16, 8, torch.float32, True),
    (2, 8, 16, 8, torch.float32, False),  # normalised by the caller, explicit scale
    (4, 20, 32, 40, torch.float32, True),  # value blocks with masked columns, a long history
    (1, 8, 16, 8, torch.bfloat16, True),
    (2, 5, 16, 8, torch.bfloat16, True),
    (4, 8, 16, 8, torch.bfloat16, True),
    (3, 16, 16, 16, torch.bfloat16, True),  # 16 value columns: the history as one product (a dot's least width)
]


# Cases with 16 value columns or more and T > 1 run the closed form by default; `chunked=False` runs them token
# by token as well (the form the others take), and key_block=16 reads the closed form's state 16 key rows at a time
# (the default, KEY_BLOCK = 32, reads K <= 32 whole) over two 32-column value blocks where V = 40; and the default
# tiling on a 64-wide key (two blocks of KEY_BLOCK rows, 64 value columns), a long history; and nine new tokens,
# whose keys and queries (18 rows) take a 32-row packed operand in the closed form
CHUNKED_CASES = ([c + (None, None) for c in GDN_CASES]
                 + [c + (False, None) for c in GDN_CASES if c[0] > 1 and c[3] >= 16]
                 + [c + (None, 16) for c in GDN_CASES if c[0] > 1 and c[3] >= 16 and c[2] > 16]
                 + [(4, 20, 64, 64, torch.bfloat16, True, None, None), (9, 12, 16, 16, torch.float32, True, None, None)])


@pytest.mark.parametrize("T,hist,K,V,dtype,norm,chunked,key_block", CHUNKED_CASES)
def test_gdn_verify_matches_torch_and_naive(T, hist, K, V, dtype, norm, chunked, key_block):
    before = gdn_pools(T, hist, K, V, dtype)
    ref, torch_p, fast = copies(before), copies(before), copies(before, DEVICE)
    x = qk_inputs(len(SLOTS), T, HV, K, V, (HV,), dtype, seed=T, norm_in_kernel=norm)
    kw = dict(use_qk_l2norm_in_kernel=norm, scale=None if norm else 0.3)
    slots = torch.tensor(SLOTS)
    o_ref = gdn_run(naive_gdn_verify, x, ref, slots, **kw)
    o_torch = gdn_run(gdn_verify, x, torch_p, slots, **kw)
    x_dev = [t.to(DEVICE) for t in x]
    o = gdn_run(gdn_verify_triton, x_dev, fast, slots.to(DEVICE), chunked=chunked, key_block=key_block,
                block_v=32 if key_block else None, **kw)
    assert o.dtype == dtype and o.shape == x[2].shape
    check_outputs(o, o_ref, o_torch, dtype_tol(dtype))
    written = gdn_written(before, T, hist)
    assert written["ssm"].any() and not written["ssm"].all()  # both folding and appending rows
    role_tol = lambda r: dtype_tol(dtype if r in ("replay_u", "replay_k") else torch.float32)  # noqa: E731
    check_roles(fast, ref, before, written, role_tol)
    for r in GDN_ROLES:
        close(fast[r].cpu().nan_to_num(), torch_p[r].nan_to_num(), role_tol(r))
    for r in ("pnat", "buf_idx"):  # read only
        assert torch.equal(fast[r].cpu(), before[r])


# KDA: pend_n per row of SLOTS, H == HV

def kda_pools(P: int, K: int, V: int, dtype, seed: int = 0) -> dict:
    """pend_n 0, P and in between; valid drafts random, everything a row must not read is NaN."""
    gen = torch.Generator().manual_seed(seed)
    p = {
        "ssm": strided(S, H, K, V),
        "pend_k": strided(S, P, H, K, dtype=dtype),
        "pend_g": strided(S, P, H, K),
        "pend_v": strided(S, P, H, V, dtype=dtype),
        "pend_beta": strided(S, P, H),
        "pend_n": strided(S, dtype=torch.int32, fill=P + 5),
    }
    for slot, n in zip(SLOTS, [P, 0, None, 1, 0, P - 1]):
        if slot < 0:
            continue
        p["pend_n"][slot] = n
        p["ssm"][slot] = torch.randn(H, K, V, generator=gen) * 0.5
        p["pend_k"][slot, :n] = torch.nn.functional.normalize(torch.randn(n, H, K, generator=gen), dim=-1).to(dtype)
        p["pend_g"][slot, :n] = -0.3 * torch.rand(n, H, K, generator=gen)
        p["pend_v"][slot, :n] = torch.randn(n, H, V, generator=gen).to(dtype)
        p["pend_beta"][slot, :n] = torch.rand(n, H, generator=gen)
    return p


def kda_written(p: dict, T: int) -> dict:
    """ssm and pend_*[:T - 1] of every live row."""
    m = {r: torch.zeros(p[r].shape, dtype=torch.bool) for r in KDA_ROLES}
    for slot in SLOTS:
        if slot >= 0:
            m["ssm"][slot] = True
            for r in KDA_ROLES[1:]:
                m[r][slot, :T - 1] = True
    return m


def kda_run(fn, x, p: dict, slots: torch.Tensor, **kw) -> torch.Tensor:
    return fn(*x, *(p[r] for r in KDA_ROLES), p["pend_n"], slots, **kw)


KDA_CASES = [  # T, P, K, V, dtype, l2norm in kernel
    (1, 3, 16, 8, torch.float32, True),
    (2, 3, 16, 8, torch.float32, False),
    (4, 4, 32, 40, torch.float32, True),  # two value blocks (32 + a masked 8), all drafts pending (n = P)
    (1, 3, 16, 8, torch.bfloat16, True),
    (2, 3, 16, 8, torch.bfloat16, True),
    (4, 3, 16, 8, torch.bfloat16, True),
    (3, 2, 16, 16, torch.bfloat16, True),
]


@pytest.fixture(params=[False, True], ids=["stepwise", "closed"])
def kda_form(request, monkeypatch) -> bool:
    """KDA's first launch token by token, then in closed form (`kda/triton_verify_closed.py`, T > 1)."""
    monkeypatch.setattr(kda_triton_verify, "CLOSED_FORM", request.param)
    return request.param


@pytest.mark.parametrize("T,P,K,V,dtype,norm", KDA_CASES)
def test_kda_verify_matches_torch_and_naive(T, P, K, V, dtype, norm, kda_form):
    before = kda_pools(P, K, V, dtype)
    ref, torch_p, fast = copies(before), copies(before), copies(before, DEVICE)
    x = qk_inputs(len(SLOTS), T, H, K, V, (H, K), dtype, seed=T, norm_in_kernel=norm)
    kw = dict(use_qk_l2norm_in_kernel=norm, scale=None if norm else 0.3)
    slots = torch.tensor(SLOTS)
    o_ref = kda_run(naive_kda_verify, x, ref, slots, **kw)
    o_torch = kda_run(kda_verify, x, torch_p, slots, **kw)
    x_dev = [t.to(DEVICE) for t in x]
    o = kda_run(kda_verify_triton, x_dev, fast, slots.to(DEVICE), **kw)
    assert o.dtype == dtype and o.shape == x[2].shape
    check_outputs(o, o_ref, o_torch, dtype_tol(dtype))
    role_tol = lambda r: dtype_tol(dtype if r in ("pend_k", "pend_v") else torch.float32)  # noqa: E731
    check_roles(fast, ref, before, kda_written(before, T), role_tol)
    for r in KDA_ROLES:
        close(fast[r].cpu().nan_to_num(), torch_p[r].nan_to_num(), role_tol(r))
    assert torch.equal(fast["pend_n"].cpu(), before["pend_n"])  # read only


# Several verify steps with the accept rule between them, Triton vs torch in lockstep

STEP_SLOTS = torch.tensor([3, -1, 0, 5])


def lockstep(run, fast_fn, slow_fn, accept, fresh: dict, make_x, T: int, steps: int, seed: int,
             observe=None) -> None:
    """`steps` verify + accept steps with random accepted counts on a Triton copy (fast_fn) and a torch copy
    (slow_fn) of the pools `fresh`; outputs and every role agree after each step. observe(pools of the torch
    copy) runs before each step."""
    gen = torch.Generator().manual_seed(seed)
    fast, slow = copies(fresh, DEVICE), copies(fresh)
    live = STEP_SLOTS >= 0
    for step in range(steps):
        if observe is not None:
            observe(slow)
        x = make_x(step)
        o = run(fast_fn, [t.to(DEVICE) for t in x], fast, STEP_SLOTS.to(DEVICE), use_qk_l2norm_in_kernel=True)
        o_torch = run(slow_fn, x, slow, STEP_SLOTS, use_qk_l2norm_in_kernel=True)
        close(o.cpu()[live], o_torch[live])
        num_valid = torch.randint(1, T + 1, (len(STEP_SLOTS),), generator=gen)
        accept(fast, STEP_SLOTS.to(DEVICE), num_valid.to(DEVICE))
        accept(slow, STEP_SLOTS, num_valid)
        for r in fresh:
            close(fast[r].cpu(), slow[r])


def test_gdn_steps_with_accepts_match_torch():
    """HIST = 5, T = 3: rows fold about every other step, the buffers flip."""
    T, hist, K, V = 3, 5, 16, 8
    gen = torch.Generator().manual_seed(hist)
    fresh = {
        "ssm": torch.randn(S, HV, K, V, generator=gen) * 0.5,
        "replay_u": torch.randn(S, 2, hist, HV, V, generator=gen),
        "replay_k": torch.randn(S, 2, hist, H, K, generator=gen),
        "replay_G": -torch.rand(S, 2, HV, hist, generator=gen),
        "replay_beta": torch.rand(S, 2, HV, hist, generator=gen),
        "pnat": torch.zeros(S, dtype=torch.int32),
        "buf_idx": torch.randint(0, 2, (S,), generator=gen, dtype=torch.int32),
    }
    folds = []

    def count_folds(p: dict) -> None:
        folds.append(int(((p["pnat"][STEP_SLOTS.clamp(min=0)] + T > hist) & (STEP_SLOTS >= 0)).sum()))

    lockstep(gdn_run, gdn_verify_triton, gdn_verify,
             lambda p, slots, nv: gdn_accept(p["pnat"], p["buf_idx"], slots, T, nv, hist), fresh,
             lambda i: delta_inputs(4, T, H, HV, K, V, (HV,), seed=i), T, 6, seed=T, observe=count_folds)
    assert sum(folds) >= 3, folds


def test_kda_steps_with_accepts_match_torch(kda_form):
    T, P, K, V = 4, 3, 16, 8
    gen = torch.Generator().manual_seed(0)
    fresh = {
        "ssm": torch.randn(S, H, K, V, generator=gen) * 0.5,
        "pend_k": torch.randn(S, P, H, K, generator=gen),
        "pend_g": -torch.rand(S, P, H, K, generator=gen),
        "pend_v": torch.randn(S, P, H, V, generator=gen),
        "pend_beta": torch.rand(S, P, H, generator=gen),
        "pend_n": torch.zeros(S, dtype=torch.int32),
    }
    lockstep(kda_run, kda_verify_triton, kda_verify,
             lambda p, slots, nv: kda_accept(p["pend_n"], slots, nv),
             fresh, lambda i: delta_inputs(4, T, H, H, K, V, (H, K), seed=i), T, 5, seed=1)


def test_kda_verify_takes_strong_decays(kda_form):
    """Decays of up to e^-40 a key row and token, pending and new (-280 over a row's 7 tokens: past fp32's
    range, so the rows' pending scale is folded into the tile on the way, and e^-40 of a padded row's scale
    meets rows that barely decay): outputs and the stored state match the naive reference, all finite."""
    T, P, K, V, dtype = 4, 3, 16, 16, torch.float32
    before = kda_pools(P, K, V, dtype)
    gen = torch.Generator().manual_seed(9)
    for slot in SLOTS:
        if slot >= 0:
            before["pend_g"][slot] = -40.0 * torch.rand(P, H, K, generator=gen)
    ref, fast = copies(before), copies(before, DEVICE)
    q, k, v, g, beta = qk_inputs(len(SLOTS), T, H, K, V, (H, K), dtype, seed=2, norm_in_kernel=True)
    g = -40.0 * torch.rand(g.shape, generator=gen) * (torch.rand(g.shape, generator=gen) < 0.5)
    slots = torch.tensor(SLOTS)
    o_ref = kda_run(naive_kda_verify, [q, k, v, g, beta], ref, slots, use_qk_l2norm_in_kernel=True)
    o = kda_run(kda_verify_triton, [t.to(DEVICE) for t in (q, k, v, g, beta)], fast, slots.to(DEVICE),
                use_qk_l2norm_in_kernel=True)
    assert o.isfinite().all()
    close(o.cpu()[LIVE], o_ref[LIVE], dtype_tol(dtype))
    check_roles(fast, ref, before, kda_written(before, T), lambda r: dtype_tol(torch.float32))


@pytest.mark.parametrize("T,P", [(4, 3), (5, 6), (5, 12)])
def test_kda_verify_with_keys_all_alike(kda_form, T, P):
    """Every draft and new token of a row on one key, β = 1 and barely a decay: each token's u undoes most of the
    one before, so the sequence's coupling is as strong as it gets (the closed form's (I + N)⁻¹ needs every
    power of N up to the sequence's length: dropping N⁴ misses this reference at 7 rows, N⁸ at 11, N¹⁶ at 17)."""
    K, V, dtype = 16, 16, torch.float32
    before = kda_pools(P, K, V, dtype)
    gen = torch.Generator().manual_seed(4)
    key = torch.nn.functional.normalize(torch.randn(H, K, generator=gen), dim=-1)
    for slot in SLOTS:
        if slot >= 0:
            before["pend_k"][slot] = key
            before["pend_g"][slot] = -0.01
            before["pend_beta"][slot] = 1.0
    ref, fast = copies(before), copies(before, DEVICE)
    q, k, v, g, beta = qk_inputs(len(SLOTS), T, H, K, V, (H, K), dtype, seed=5, norm_in_kernel=True)
    k = key.expand_as(k).contiguous() * 3.0  # normalised in the kernel
    g, beta = torch.full_like(g, -0.01), torch.ones_like(beta)
    slots = torch.tensor(SLOTS)
    o_ref = kda_run(naive_kda_verify, [q, k, v, g, beta], ref, slots, use_qk_l2norm_in_kernel=True)
    o = kda_run(kda_verify_triton, [t.to(DEVICE) for t in (q, k, v, g, beta)], fast, slots.to(DEVICE),
                use_qk_l2norm_in_kernel=True)
    close(o.cpu()[LIVE], o_ref[LIVE], dtype_tol(dtype))
    check_roles(fast, ref, before, kda_written(before, T), lambda r: dtype_tol(torch.float32))


@pytest.mark.skipif(DEVICE != "cuda", reason="dispatch needs CUDA (CPU tensors always take the torch paths)")
def test_ops_dispatch_to_triton_on_cuda():
    """gdn_verify / kda_verify on CUDA are the Triton kernels, bit for bit. (No host sync and CUDA-graph
    replay of the dispatched ops: tests/ops/test_gdn_kda_sync_free.py.)"""
    T, hist, K, V = 2, 8, 16, 8
    p = gdn_pools(T, hist, K, V, torch.float32)
    x = [t.cuda() for t in delta_inputs(len(SLOTS), T, H, HV, K, V, (HV,))]
    a, b = copies(p, "cuda"), copies(p, "cuda")
    slots = torch.tensor(SLOTS, device="cuda")
    assert torch.equal(gdn_run(gdn_verify, x, a, slots), gdn_run(gdn_verify_triton, x, b, slots))
    q = kda_pools(3, K, V, torch.float32)
    x = [t.cuda() for t in delta_inputs(len(SLOTS), T, H, H, K, V, (H, K))]
    a, b = copies(q, "cuda"), copies(q, "cuda")
    assert torch.equal(kda_run(kda_verify, x, a, slots), kda_run(kda_verify_triton, x, b, slots))
