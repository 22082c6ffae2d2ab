"""The n-gram drafter's device search in one Triton launch (`ops/ngram_triton.py`) against the host
drafter (`NgramDrafter.propose`, padded as a verify step feeds it) and the torch form it replaces on CUDA:
random short histories (hypothesis), a history over several candidate blocks, and rows laid out as
`TokenHistory` keeps them (a slice of a wider tensor). Runs on CUDA, or on CPU tensors in the interpreter."""
from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from hybridcache import SpeculativeConfig
from hybridcache.engine.drafter import NgramDrafter
from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if not triton_testable(torch.empty(0, device=DEVICE)):
    pytest.skip("needs triton and CUDA, or CPU tensors under TRITON_INTERPRET=1", allow_module_level=True)

from hybridcache.ops.ngram_triton import BLOCK_C, ngram_propose_triton  # noqa: E402


def laid_out(rows: list[list[int]], spare: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows as TokenHistory holds them: -1 past each row's tokens, lengths in an extra last column."""
    width = max(map(len, rows)) + spare
    both = torch.full((len(rows), width + 1), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        both[i, : len(r)], both[i, -1] = torch.tensor(r), len(r)
    both = both.to(DEVICE)
    return both[:, :width], both[:, width].clone()


def expected(d: NgramDrafter, rows: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    return [NgramDrafter.pad(d.propose(r), r[-1], d.k) for r in rows], [len(d.propose(r)) for r in rows]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=4),
       st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(0, 6))
def test_the_kernel_proposes_what_the_host_drafter_does(rows, k, max_n, min_n, spare):
    min_n = min(min_n, max_n)
    d = NgramDrafter(SpeculativeConfig(num_draft_tokens=k, max_ngram=max_n, min_ngram=min_n))
    history, lengths = laid_out(rows, spare)
    drafts, proposed = ngram_propose_triton(history, lengths, k, max_n, min_n)
    assert (drafts.tolist(), proposed.tolist()) == expected(d, rows)


def test_a_history_over_several_candidate_blocks():
    g = torch.Generator().manual_seed(0)
    long = torch.randint(0, 50, (3 * BLOCK_C + 17,), generator=g).tolist()
    rows = [long + long[100:104], long[:BLOCK_C + 3] + long[5:8], long[:40], [7]]  # late, early, none, one token
    d = NgramDrafter(SpeculativeConfig(num_draft_tokens=3))
    history, lengths = laid_out(rows, 5)
    drafts, proposed = ngram_propose_triton(history, lengths, d.k, d.max_n, d.min_n)
    assert (drafts.tolist(), proposed.tolist()) == expected(d, rows)
    assert proposed.tolist()[:2] == [3, 3]


@pytest.mark.skipif(DEVICE != "cpu", reason="routes CPU tensors through the kernel (the interpreter)")
def test_the_drafter_dispatches_to_the_kernel(monkeypatch):
    import hybridcache.ops.ngram_triton as ngram

    calls = []
    monkeypatch.setattr(ngram, "ngram_propose_triton", lambda *a, _real=ngram.ngram_propose_triton:
                        (calls.append(1), _real(*a))[1])
    rows = [[1, 2, 3, 1, 2], [4, 4, 4]]
    d = NgramDrafter(SpeculativeConfig(num_draft_tokens=2))
    history, lengths = laid_out(rows, 2)
    torch_form = d.propose_on_device(history, lengths)
    with kernels_on_cpu():
        kernel_form = d.propose_on_device(history, lengths)
    assert calls == [1] and all(torch.equal(a, b) for a, b in zip(kernel_form, torch_form))


@pytest.mark.parametrize("T", [1, 4])
def test_the_append_kernel_equals_the_torch_append(T):
    from hybridcache.engine.async_verify import TokenHistory

    g = torch.Generator().manual_seed(T)
    rows = [torch.randint(0, 9, (n,), generator=g).tolist() for n in (3, 7, 1)]
    tokens = torch.randint(0, 9, (3, T), generator=g)
    counts = torch.tensor([T, 1, max(1, T - 1)])
    want = TokenHistory.__new__(TokenHistory)
    want.history, want.lengths = laid_out(rows, 2 * T)
    want.history, want.lengths = want.history.cpu().clone(), want.lengths.cpu()
    want.append(tokens, counts)  # the torch form (CPU tensors)
    history, lengths = laid_out(rows, 2 * T)
    from hybridcache.ops.ngram_triton import history_append_triton

    last = history_append_triton(history, lengths, tokens.to(DEVICE), counts.to(DEVICE))
    assert torch.equal(history.cpu(), want.history) and torch.equal(lengths.cpu(), want.lengths)
    assert torch.equal(last.cpu(), want.last())
    # the tokens as a greedy verify graph leaves them: columns of a wider block (a row stride of T + 2)
    history, lengths = laid_out(rows, 2 * T)
    block = torch.cat([counts[:, None], counts[:, None], tokens], 1).to(DEVICE)
    last = history_append_triton(history, lengths, block[:, 2:], counts.to(device=DEVICE, dtype=torch.int32))
    assert torch.equal(history.cpu(), want.history) and torch.equal(lengths.cpu(), want.lengths)
    assert torch.equal(last.cpu(), want.last())


@pytest.mark.skipif(DEVICE != "cpu", reason="routes CPU tensors through the kernel (the interpreter)")
def test_token_history_appends_with_the_kernel(monkeypatch):
    from hybridcache.engine.async_verify import TokenHistory
    import hybridcache.ops.ngram_triton as ngram

    calls = []
    monkeypatch.setattr(ngram, "history_append_triton", lambda *a, _real=ngram.history_append_triton:
                        (calls.append(1), _real(*a))[1])
    th = TokenHistory.__new__(TokenHistory)
    th.history, th.lengths = laid_out([[1, 2], [3]], 4)
    with kernels_on_cpu():
        th.append(torch.tensor([[5, 6], [7, 8]]), torch.tensor([2, 1]))
    assert calls == [1] and th.lengths.tolist() == [4, 2] and th.last().tolist() == [6, 7]
    assert th.history[:, :4].tolist() == [[1, 2, 5, 6], [3, 7, -1, -1]]
