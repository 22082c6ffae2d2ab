"""A verify kernel's new tokens, loaded all at once: rows [TP, W] (TP = T rounded up to a power of two)
read in one round trip at the start, then taken out one token at a time. Loaded token by token instead,
each token's loads would wait behind the stores of the token before (the compiler cannot move a load
above a store it cannot prove elsewhere), one memory round trip a token.

Mamba2's verify (`mamba2/triton_verify.py`) loads so; the delta-rule verify kernels load token by token:
their preloading forms, timed on an H100 against the token-by-token ones (benchmarks/tune_delta_rule.py,
T = 4, batches 64 and 16), were no faster (GDN 155.3 / 36.2 us against 155.2 / 34.7, KDA 100.4 / 23.4
against 100.3 / 22.3) and were removed."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def token_row(rows, tt, t):
    """Row t of rows [TP, W] (tt = arange(TP)), in their dtype: a sum of it and -0.0s, so every value comes
    out as it is, -0.0 and NaN included. Rows stay in the inputs' dtype until taken out: half the registers
    of fp32 for 16-bit inputs."""
    return tl.sum(tl.where(tt[:, None] == t, rows, -0.0), 0)


@triton.jit
def token_value(values, tt, t):
    """Element t of values [TP], exactly (as `token_row`)."""
    return tl.sum(tl.where(tt == t, values, -0.0), 0)
