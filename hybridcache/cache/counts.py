"""Token and accept counts as they cross into the cache: int64 arrays, or a typed error and nothing changed."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import InvalidCountError

MAX_TOKENS = 2**31 - 1  # token counts travel to kernels as int32
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def int_array(values, what: str, rows: int | None = None) -> np.ndarray:
    """`values` as int64 (an int broadcast to `rows`); floats, bools and overflowing ints are refused."""
    if type(values) is list and all(type(v) is int and _INT64_MIN <= v <= _INT64_MAX for v in values):
        return np.array(values, dtype=np.int64)  # a step's usual form, checked in Python: it costs 7 us below
    if isinstance(values, (int, np.integer)) and not isinstance(values, bool) and rows is not None:
        if _INT64_MIN <= values <= _INT64_MAX:
            return np.full(rows, values, dtype=np.int64)
        values = [int(values)] * rows
    if hasattr(values, "detach"):  # a tensor: read it on the host
        values = values.detach().cpu().numpy()
    if isinstance(values, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in values):
        raise InvalidCountError(f"{what} must be integers, got a bool among {list(values)[:8]}")
    try:
        a = np.asarray(values)
    except (OverflowError, ValueError) as err:
        raise InvalidCountError(f"{what}: {err}") from None
    if a.dtype == object or not (np.issubdtype(a.dtype, np.integer) or a.size == 0) or a.dtype == np.bool_:
        raise InvalidCountError(f"{what} must be integers, got {a.dtype}")
    if a.dtype == np.uint64 and a.size and a.max() > np.iinfo(np.int64).max:
        raise InvalidCountError(f"{what} overflow int64")
    return a.astype(np.int64).reshape(-1) if a.ndim else a.astype(np.int64).reshape(1)


def token_counts(num_new: Sequence[int] | int, rows: int) -> np.ndarray:
    """[rows] int64 new-token counts of a step, each in [1, MAX_TOKENS] (an int applies to every row)."""
    if type(num_new) is int and 1 <= num_new <= MAX_TOKENS:  # a decode step's form: numpy's checks cost 10-16 us
        return np.full(rows, num_new, dtype=np.int64)
    if type(num_new) is list and len(num_new) == rows and all(type(v) is int and 1 <= v <= MAX_TOKENS for v in num_new):
        return np.array(num_new, dtype=np.int64)
    n = int_array(num_new, "token counts", rows)
    if n.shape != (rows,):
        raise InvalidCountError(f"{rows} rows but {n.size} token counts")
    if n.size and (n.min() < 1 or n.max() > MAX_TOKENS):
        raise InvalidCountError(f"token counts must be in [1, {MAX_TOKENS}], got {n.tolist()[:8]}")
    return n
