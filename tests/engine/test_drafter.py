from hybridcache.engine.drafter import NgramDrafter
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
