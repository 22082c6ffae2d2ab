"""Gated DeltaNet replay verify: fast vs naive, and replay vs feeding only the accepted tokens."""
import pytest
import torch

from hybridcache.ops.gdn import gdn_accept, gdn_replay_state, gdn_verify
from hybridcache.ops.gdn.naive import naive_gated_delta_rule, naive_gdn_replay_state, naive_gdn_verify
from hybridcache.states.gdn import GDNState
from tests.ops import delta_rule_cases as cases
from tests.ops.test_gdn import inputs

S, H, HV, K, V = 6, 2, 4, 16, 8


def pools(hist: int, role_dtype=torch.float32, seed=0):
    """One layer's GDN roles with random checkpoints and stale (random) history."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "ssm": torch.randn(S, HV, K, V, generator=gen) * 0.5,
        "replay_u": torch.randn(S, 2, hist, HV, V, generator=gen).to(role_dtype),
        "replay_k": torch.randn(S, 2, hist, H, K, generator=gen).to(role_dtype),
        "replay_G": -torch.rand(S, 2, HV, hist, generator=gen),
        "replay_beta": torch.rand(S, 2, HV, hist, generator=gen),
        "pnat": torch.zeros(S, dtype=torch.int32),
        "buf_idx": torch.randint(0, 2, (S,), generator=gen, dtype=torch.int32),
    }


ROLES = ["ssm", "replay_u", "replay_k", "replay_G", "replay_beta"]


def verify(fn, x, p, slots, device="cpu"):
    args = [t.to(device) for t in x] + [p[r] for r in ROLES] + [p["pnat"], p["buf_idx"], slots.to(device)]
    return fn(*args, use_qk_l2norm_in_kernel=True)


def seed_history(p, hist, T, gen):
    """Give every slot a valid history of random length by running verify steps with random accepts."""
    slots = torch.arange(S)
    for step in range(3):
        x = inputs(S, T, H, HV, K, V, seed=100 + step)
        naive_gdn_verify(*x, *(p[r] for r in ROLES), p["pnat"], p["buf_idx"], slots, use_qk_l2norm_in_kernel=True)
        gdn_accept(p["pnat"], p["buf_idx"], slots, T, torch.randint(1, T + 1, (S,), generator=gen), hist)


@pytest.mark.parametrize("role_dtype,in_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("T,hist", [(1, 4), (4, 5), (4, 16), (8, 8)])
def test_verify_matches_naive(device, T, hist, role_dtype, in_dtype):
    gen = torch.Generator().manual_seed(T * 100 + hist)
    ref = pools(hist, role_dtype)
    seed_history(ref, hist, T, gen)
    fast = {r: t.clone().to(device) for r, t in ref.items()}
    before = {r: t.clone() for r, t in ref.items()}
    assert len(set(ref["pnat"].tolist())) > 1 or T == 1  # rows mix PNAT values
    slots = torch.tensor(cases.VERIFY_SLOTS)
    x = inputs(5, T, H, HV, K, V, in_dtype, seed=7)
    o_ref = verify(naive_gdn_verify, x, ref, slots)
    o = verify(gdn_verify, x, fast, slots, device)
    cases.check_verify_step(o, o_ref, fast, ref, before, ROLES, slots, cases.dtype_tol(in_dtype),
                            lambda r: cases.dtype_tol(role_dtype if r in ("replay_u", "replay_k") else torch.float32))


def test_the_pool_keeps_u_and_normalised_keys_in_fp32():
    """16-bit activations: the history's u and normalised keys are computed in fp32 and kept so."""
    state = GDNState(1, H, HV, K, V, 4, dtype=torch.bfloat16, num_draft_tokens=3)
    assert all(r.dtype == torch.float32 for r in state.roles() if r.name.startswith("replay_"))


@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T,hist", [(1, 16), (4, 5), (4, 16), (8, 9)])
def test_replay_equals_accepted_tokens_one_at_a_time(device, T, hist, in_dtype):
    """Many verify steps with random accepts (folds and flips included) vs feeding only accepted tokens; with
    bf16 inputs too, the replayed states to fp32 tolerance (the pool's fp32 history)."""
    gen = torch.Generator().manual_seed(T + hist)
    p = {r: t.to(device) for r, t in pools(hist).items()}
    slots = torch.tensor(cases.SEQ_SLOTS)
    live, state = cases.live_states(p["ssm"], slots)
    folds = 0
    for step in range(10):
        x = inputs(len(slots), T, H, HV, K, V, in_dtype, seed=step)
        folds += int(((p["pnat"][slots.clamp(min=0)].cpu() + T > hist) & (slots >= 0)).sum())
        o = verify(gdn_verify, x, p, slots, device).cpu()
        num_valid = torch.randint(1, T + 1, (len(slots),), generator=gen)
        cases.check_accepted_prefix(o, x, num_valid, live, state, naive_gated_delta_rule, cases.dtype_tol(in_dtype))
        gdn_accept(p["pnat"], p["buf_idx"], slots.to(device), T, num_valid.to(device), hist)
        eff = gdn_replay_state(*(p[r] for r in ("ssm", "replay_u", "replay_k", "replay_G", "pnat", "buf_idx")),
                               slots.to(device)).cpu()
        cases.check_effective_states(eff, live, state)
    assert folds > 0 or T == 1


def test_replay_state_matches_naive_and_padding_reads_zero():
    hist, T = 8, 3
    p = pools(hist)
    seed_history(p, hist, T, torch.Generator().manual_seed(1))
    cases.check_state_fn(gdn_replay_state, naive_gdn_replay_state,
                         [p[r] for r in ("ssm", "replay_u", "replay_k", "replay_G", "pnat", "buf_idx")])


def test_accept_bookkeeping():
    pnat = torch.tensor([0, 3, 5, 7], dtype=torch.int32)
    buf = torch.tensor([0, 1, 0, 1], dtype=torch.int32)
    # T = 4, HIST = 8: slots 2 (5 + 4 > 8) and 3 fold and flip; slot 0 is not in the batch
    gdn_accept(pnat, buf, torch.tensor([1, 2, -1, 3]), 4, torch.tensor([2, 4, 1, 1]), 8)
    assert pnat.tolist() == [0, 5, 4, 1] and buf.tolist() == [0, 1, 1, 0]
    none = torch.tensor([], dtype=torch.long)
    gdn_accept(pnat, buf, none, 4, none, 8)  # no rows
    # T per row: slot 1 (5 + 2 <= 8) appends, slot 2 (4 + 5 > 8) folds
    gdn_accept(pnat, buf, torch.tensor([1, 2]), torch.tensor([2, 5]), torch.tensor([1, 3]), 8)
    assert pnat.tolist() == [0, 6, 3, 1] and buf.tolist() == [0, 1, 0, 0]
