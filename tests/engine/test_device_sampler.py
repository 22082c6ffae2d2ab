"""The batched device sampler against the per-request reference `choose` / `probabilities`."""
import pytest
import torch

from hybridcache.engine.device_sampler import (RowParams, filtered_probs, greedy_verify_choice, sample, sample_greedy,
                                               uniform)
from hybridcache.engine.params import SamplingParams
from hybridcache.engine.sampler import choose, probabilities
from tests.ops.tripwire import no_host_sync


def rows(R, T, temperature=0.0, top_k=0, top_p=1.0, drafts=None, num_drafts=None, seed=0, position=0):
    full = lambda v, dt: torch.full((R,), v, dtype=dt)  # noqa: E731
    drafts = torch.zeros(R, T - 1, dtype=torch.long) if drafts is None else drafts
    nd = full(T - 1, torch.long) if num_drafts is None else num_drafts
    return RowParams(full(temperature, torch.float32), full(top_k, torch.long), full(top_p, torch.float32),
                     torch.arange(R, dtype=torch.long) + seed, full(position, torch.long), drafts, nd)


@pytest.mark.parametrize("top_k,top_p,temperature", [(0, 1.0, 1.0), (3, 1.0, 0.7), (0, 0.8, 1.3), (5, 0.5, 0.5),
                                                       (50, 1e-300, 1.0)])
def test_filtered_probs_equal_the_reference(top_k, top_p, temperature):
    logits = torch.randn(3, 2, 17, generator=torch.Generator().manual_seed(1)) * 3
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    r = rows(3, 2, temperature, top_k, top_p)
    got = filtered_probs(logits, r.temperature, r.top_k, r.top_p)
    for i in range(3):
        torch.testing.assert_close(got[i], probabilities(logits[i], params), atol=1e-6, rtol=1e-5)


def test_greedy_equals_choose_row_by_row():
    g = torch.Generator().manual_seed(0)
    R, T, V = 64, 4, 11
    logits = torch.randn(R, T, V, generator=g)
    best = logits.argmax(-1)
    drafts = torch.where(torch.rand(R, T - 1, generator=g) < 0.6, best[:, :-1], torch.randint(0, V, (R, T - 1), generator=g))
    num = torch.randint(0, T, (R,), generator=g)
    with no_host_sync():
        tokens, counts = sample(logits, rows(R, T, drafts=drafts, num_drafts=num))
    for i in range(R):
        d = drafts[i, : num[i]].tolist()
        want = choose(logits[i, : len(d) + 1], d, SamplingParams(), None)
        assert tokens[i, : counts[i]].tolist() == want


@pytest.mark.parametrize("T", [1, 2, 4])
def test_sample_greedy_gives_what_sample_gives_greedy_rows(T):
    """The greedy fast path: the same counts and the same tokens through each row's count as `sample`,
    with rows of every number of drafts (the rest padded with -1), drafts that match and that do not."""
    g = torch.Generator().manual_seed(T)
    R, V = 96, 7
    logits = torch.randn(R, T, V, generator=g)
    best = logits.argmax(-1)
    drafts = torch.where(torch.rand(R, T - 1, generator=g) < 0.7, best[:, :-1], torch.randint(0, V, (R, T - 1), generator=g))
    num = torch.randint(0, T, (R,), generator=g)
    proposed = torch.where(torch.arange(T - 1) < num[:, None], drafts, -1)
    with no_host_sync():
        fast, fast_counts = sample_greedy(logits, proposed)
    tokens, counts = sample(logits, rows(R, T, drafts=drafts, num_drafts=num))
    assert fast_counts.tolist() == counts.tolist()
    assert (counts > 1).any() and (counts < T).any() if T > 1 else (counts == 1).all()  # both cases occur
    for i in range(R):
        assert fast[i, : counts[i]].tolist() == tokens[i, : counts[i]].tolist()


@pytest.mark.parametrize("T", [1, 2, 4])
def test_the_graph_form_chooses_what_sample_greedy_does(T):
    """`greedy_verify_choice` (what a greedy verify graph runs) against `sample_greedy`: the fed ids hold
    each row's last token then its drafts, padded past the proposed ones with tokens that would pass
    (the argmax), which must not; the packed block holds the count, the proposed number, the tokens."""
    g = torch.Generator().manual_seed(10 + T)
    R, V = 96, 7
    logits = torch.randn(R, T, V, generator=g)
    best = logits.argmax(-1)
    other = torch.randint(0, V, (R, T - 1), generator=g)
    drafts = torch.where(torch.rand(R, T - 1, generator=g) < 0.7, best[:, :-1], other)
    num = torch.randint(0, T, (R,), generator=g)
    padded = torch.where(torch.arange(T - 1) < num[:, None], drafts, best[:, :-1])  # padding that would pass
    ids = torch.cat([torch.randint(0, V, (R, 1), generator=g), padded], 1)
    with no_host_sync():
        choice, counts32 = greedy_verify_choice(logits, ids, num)
    tokens, counts = sample_greedy(logits, torch.where(torch.arange(T - 1) < num[:, None], drafts, -1))
    assert counts32.dtype == torch.int32 and counts32.tolist() == counts.tolist() == choice[:, 0].tolist()
    assert choice[:, 1].tolist() == num.tolist() and torch.equal(choice[:, 2:], tokens)
    assert (counts > 1).any() and (counts < num + 1).any() if T > 1 else (counts == 1).all()


@pytest.mark.parametrize("draft", [None, 0, 2])
def test_the_first_token_keeps_the_target_distribution(draft):
    """Over many rows (different seeds), the first emitted token is distributed as plain sampling's."""
    target = torch.tensor([0.1, 0.2, 0.6, 0.1])
    n = 20000
    T = 1 if draft is None else 2
    logits = torch.log(target).repeat(n, T, 1)
    drafts = torch.full((n, T - 1), draft or 0, dtype=torch.long)
    tokens, counts = sample(logits, rows(n, T, temperature=1.0, drafts=drafts, seed=7))
    freq = torch.bincount(tokens[:, 0], minlength=4).float() / n
    assert torch.allclose(freq, target, atol=0.015), freq.tolist()
    if draft is not None:  # the draft is kept with probability p(draft)
        assert abs((counts == 2).float().mean() - target[draft]) < 0.015


def test_draws_depend_only_on_seed_position_and_stream():
    seed = torch.tensor([0, 1, 2**63 - 1, -1])
    counter = torch.tensor([[0, 1], [0, 1], [5, 6], [5, 6]])
    u = uniform(seed, counter, 1)
    assert ((u >= 0) & (u < 1)).all()
    assert torch.equal(u, uniform(seed, counter, 1)) and not torch.equal(u, uniform(seed, counter, 0))
    assert len(set(u.flatten().tolist())) == 8
    logits = torch.randn(4, 1, 9, generator=torch.Generator().manual_seed(3))
    a, _ = sample(logits, rows(4, 1, temperature=1.0, seed=11, position=3))
    b, _ = sample(logits[[2, 0]], RowParams(*(t[[2, 0]] for t in vars(rows(4, 1, temperature=1.0, seed=11, position=3)).values())))
    assert a[[2, 0]].tolist() == b.tolist()  # a row's draw does not depend on its batch


def test_upload_packs_every_field_in_one_copy():
    r = RowParams.upload([0.0, 0.7], [0, 5], [1.0, 0.25], [-3, 2**62], [4, 9], [[7], []], 2, torch.device("cpu"))
    assert r.temperature.tolist() == [0.0, pytest.approx(0.7)] and r.top_p.tolist() == [1.0, 0.25]
    assert r.top_k.tolist() == [0, 5] and r.seed.tolist() == [-3, 2**62] and r.position.tolist() == [4, 9]
    assert r.drafts.tolist() == [[7, 0], [0, 0]] and r.num_drafts.tolist() == [1, 0]
