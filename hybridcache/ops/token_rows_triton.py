"""A verify kernel's new tokens, loaded all at once: rows [TP, W] (TP = T rounded up to a power of two)
read in one round trip at the start, then taken out one token at a time. Loaded token by token instead,
each token's loads would wait behind the stores of the token before (the compiler cannot move a load
above a store it cannot prove elsewhere), one memory round trip a token."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def token_row(rows, tt, t):
    """Row t of rows [TP, W] fp32 (tt = arange(TP)): a sum of it and -0.0s, so every value comes out as it
    is, -0.0 and NaN included."""
    return tl.sum(tl.where(tt[:, None] == t, rows, -0.0), 0)


@triton.jit
def token_value(values, tt, t):
    """Element t of values [TP] fp32, exactly (as `token_row`)."""
    return tl.sum(tl.where(tt == t, values, -0.0), 0)
