"""KDA verify with pending-draft caches: fast vs naive, and verify vs feeding only the accepted tokens."""
import pytest
import torch

from hybridcache.ops.kda import kda_accept, kda_effective_state, kda_verify
from hybridcache.ops.kda.naive import naive_kda, naive_kda_effective_state, naive_kda_verify
from hybridcache.states.kda import KDAState
from tests.ops import delta_rule_cases as cases
from tests.ops.test_kda import inputs

S, H, K, V = 6, 2, 16, 8
ROLES = ["ssm", "pend_k", "pend_g", "pend_v", "pend_beta"]


def pools(P: int, dtype=torch.float32, seed=0):
    """One layer's KDA roles; stale random pending caches and random pend_n in [0, P]."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "ssm": torch.randn(S, H, K, V, generator=gen) * 0.5,
        "pend_k": torch.nn.functional.normalize(torch.randn(S, P, H, K, generator=gen), dim=-1).to(dtype),
        "pend_g": -torch.rand(S, P, H, K, generator=gen),
        "pend_v": torch.randn(S, P, H, V, generator=gen).to(dtype),
        "pend_beta": torch.rand(S, P, H, generator=gen),
        "pend_n": torch.randint(0, P + 1, (S,), generator=gen, dtype=torch.int32),
    }


def verify(fn, x, p, slots, device="cpu"):
    args = [t.to(device) for t in x] + [p[r] for r in ROLES] + [p["pend_n"], slots.to(device)]
    return fn(*args, use_qk_l2norm_in_kernel=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,P", [(1, 3), (4, 3), (3, 7), (8, 7)])
def test_verify_matches_naive(device, T, P, dtype):
    ref = pools(P, dtype)
    assert len(set(ref["pend_n"].tolist())) > 1  # rows mix pend_n values
    before = {r: t.clone() for r, t in ref.items()}
    fast = {r: t.clone().to(device) for r, t in ref.items()}
    slots = torch.tensor(cases.VERIFY_SLOTS)
    x = inputs(5, T, H, K, V, dtype, seed=T)
    o_ref = verify(naive_kda_verify, x, ref, slots)
    o = verify(kda_verify, x, fast, slots, device)
    cases.check_verify_step(o, o_ref, fast, ref, before, ROLES, slots, cases.dtype_tol(dtype),
                            lambda r: cases.dtype_tol(dtype if r in ("pend_k", "pend_v") else torch.float32))


def test_the_pool_keeps_normalised_keys_in_fp32():
    """16-bit activations: pend_v holds the input v (exact in its dtype), pend_k the keys normalised in fp32."""
    roles = {r.name: r.dtype for r in KDAState(1, H, K, 4, dtype=torch.bfloat16, num_draft_tokens=3).roles()}
    assert roles["pend_k"] == roles["pend_g"] == roles["pend_beta"] == torch.float32
    assert roles["pend_v"] == torch.bfloat16


@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T", [1, 4, 8])
def test_verify_equals_accepted_tokens_one_at_a_time(device, T, in_dtype):
    """bf16 inputs in the pool's layout (pend_v in bf16, the rest fp32): the states after the accepted drafts
    replay are the per-token states to fp32 tolerance, as in fp32 (a bf16 pend_k would be ~1e-3 off)."""
    gen = torch.Generator().manual_seed(T)
    p = {r: t.to(device) for r, t in pools(max(T - 1, 1)).items()}
    p["pend_v"] = p["pend_v"].to(in_dtype)
    p["pend_n"].zero_()
    slots = torch.tensor(cases.SEQ_SLOTS)
    live, state = cases.live_states(p["ssm"], slots)
    for step in range(10):
        x = inputs(len(slots), T, H, K, V, in_dtype, seed=step)
        o = verify(kda_verify, x, p, slots, device).cpu()
        num_valid = torch.randint(1, T + 1, (len(slots),), generator=gen)
        cases.check_accepted_prefix(o, x, num_valid, live, state, naive_kda, cases.dtype_tol(in_dtype))
        kda_accept(p["pend_n"], slots.to(device), num_valid.to(device))
        eff = kda_effective_state(*(p[r] for r in ROLES), p["pend_n"], slots.to(device)).cpu()
        cases.check_effective_states(eff, live, state)


def test_effective_state_matches_naive_and_padding_reads_zero():
    p = pools(5)
    cases.check_state_fn(kda_effective_state, naive_kda_effective_state, [p[r] for r in ROLES] + [p["pend_n"]])


def test_accept_bookkeeping():
    pend_n = torch.tensor([2, 2, 2, 2], dtype=torch.int32)
    kda_accept(pend_n, torch.tensor([3, -1, 0]), torch.tensor([1, 4, 4]))
    assert pend_n.tolist() == [3, 2, 2, 0]
    kda_accept(pend_n, torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long))  # no rows
    assert pend_n.tolist() == [3, 2, 2, 0]
