"""cache/counts.py: the Python-checked forms (an int, a list of ints) give what the numpy path gives, and refuse
what it refuses."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from hybridcache.cache.counts import MAX_TOKENS, int_array, token_counts
from hybridcache.cache.errors import InvalidCountError

VALUES = st.one_of(st.integers(-3, 3), st.integers(MAX_TOKENS - 1, MAX_TOKENS + 1), st.integers(2**62, 2**64),
                   st.booleans(), st.floats(-2, 2))


def outcome(fn, *args):
    try:
        return fn(*args).tolist()
    except InvalidCountError:
        return "refused"


@given(st.lists(VALUES, max_size=6), st.integers(0, 6))
def test_a_list_gives_what_its_numpy_form_gives(values, rows):
    as_numpy = np.array(values, dtype=object) if values else np.zeros(0, dtype=np.int64)
    # object arrays are refused whole: compare with the numpy form only where numpy takes the list as integers
    if all(type(v) is int and -(2**63) <= v < 2**63 for v in values):
        as_numpy = np.array(values, dtype=np.int64)
        assert outcome(token_counts, values, rows) == outcome(token_counts, as_numpy, rows)
        assert outcome(int_array, values, "x") == outcome(int_array, as_numpy, "x")
    else:
        assert outcome(token_counts, values, rows) == "refused"
        assert outcome(int_array, values, "x") == "refused"


@given(VALUES, st.integers(0, 4))
def test_an_int_gives_what_its_numpy_form_gives(value, rows):
    if type(value) is int and -(2**63) <= value < 2**63:
        assert outcome(token_counts, value, rows) == outcome(token_counts, np.int64(value), rows)
    elif type(value) is not int or rows:  # bools and floats at any row count, an overflowing int over rows
        assert outcome(token_counts, value, rows) == "refused"
    else:  # an overflowing int over no rows counts for none, as any int does there
        assert outcome(token_counts, value, rows) == []


@pytest.mark.parametrize("values", [[1, 2, 3], (1, 2, 3)])
def test_the_result_is_a_fresh_int64_array(values):
    a = token_counts(values, 3)
    assert a.dtype == np.int64 and a.tolist() == [1, 2, 3]
    a[0] = 7  # its own memory: the caller may keep it in a plan
    assert token_counts(values, 3).tolist() == [1, 2, 3]
