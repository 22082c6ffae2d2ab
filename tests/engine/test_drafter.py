import hypothesis.strategies as st
from hypothesis import given, settings

from hybridcache.engine.drafter import NgramDrafter, scan_propose
from hybridcache.engine.params import SpeculativeConfig


def test_proposes_the_continuation_of_the_longest_recent_match():
    d = NgramDrafter(SpeculativeConfig(num_draft_tokens=3, max_ngram=3))
    #        0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 2, 5, 6, 7]
    # suffix [5, 6, 7] matched at 0 -> continuation [8, 9, 1]
    assert d.propose(tokens) == [8, 9, 1]
    # suffix [1, 6, 7] matches at 5 -> [2, 1, 6]; the shorter [6, 7] (at 1, -> [8, 9, 1]) loses to it
    assert d.propose(tokens[:-3] + [1, 6, 7]) == [2, 1, 6]


def test_most_recent_occurrence_of_a_suffix_wins():
    d = NgramDrafter(SpeculativeConfig(num_draft_tokens=2, max_ngram=1))
    assert d.propose([4, 1, 4, 2, 3, 4]) == [2, 3]


def test_no_match_gives_no_drafts_and_padding_fills_to_the_step_length():
    d = NgramDrafter(SpeculativeConfig(num_draft_tokens=3))
    assert d.propose([1, 2, 3, 4]) == []
    assert NgramDrafter.pad([], 4, 3) == [4, 4, 4]
    assert NgramDrafter.pad(d.propose([1, 2, 1]), 1, 3) == [2, 1, 1]
    assert NgramDrafter.pad([7, 8], 1, 2) == [7, 8]


def test_continuation_shorter_than_k_is_returned_as_is():
    d = NgramDrafter(SpeculativeConfig(num_draft_tokens=4, max_ngram=2))
    assert d.propose([9, 3, 9]) == [3, 9]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=60) | st.lists(st.integers(0, 2**31 - 1), max_size=30)
       | st.lists(st.sampled_from([0, 1, 256, 257, 65536, 65537, 2**24, 2**24 + 1]), max_size=40),
       st.integers(1, 5), st.integers(1, 4), st.integers(1, 4))
def test_propose_equals_the_scan(tokens, k, max_n, min_n):
    """Small alphabets (many matches), large ids, and ids whose bytes repeat (hits that straddle words)."""
    d = NgramDrafter(SpeculativeConfig(num_draft_tokens=k, max_ngram=max(max_n, min_n), min_ngram=min(max_n, min_n)))
    assert d.propose(tokens) == scan_propose(tokens, k, max(max_n, min_n), min(max_n, min_n))


def test_a_hit_across_word_boundaries_is_not_a_match():
    # as bytes, [1, 256] is 01 00 00 00 00 01 00 00: the suffix [1] (01 00 00 00) also appears at byte 5
    d = NgramDrafter(SpeculativeConfig(num_draft_tokens=2, max_ngram=1))
    assert d.propose([256, 1, 0, 0, 256, 1]) == [0, 0]
    assert d.propose([1, 256, 256, 1]) == [256, 256]
    assert d.propose([2, 256, 5, 1]) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=5),
       st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(0, 6))
def test_propose_on_device_equals_the_host_proposal_padded(rows, k, max_n, min_n, spare):
    """Every row of a padded history [R, W] (-1 past its tokens, `spare` extra columns) gets what the host
    drafter proposes for it, padded to k as a verify step feeds it."""
    import torch

    min_n = min(min_n, max_n)
    d = NgramDrafter(SpeculativeConfig(num_draft_tokens=k, max_ngram=max_n, min_ngram=min_n))
    width = max(map(len, rows)) + spare
    history = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        history[i, : len(r)] = torch.tensor(r)
    drafts, proposed = d.propose_on_device(history, torch.tensor([len(r) for r in rows]))
    assert drafts.tolist() == [NgramDrafter.pad(d.propose(r), r[-1], k) for r in rows]
    assert proposed.tolist() == [len(d.propose(r)) for r in rows]
