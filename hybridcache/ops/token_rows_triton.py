"""A verify kernel's new tokens, loaded all at once: rows [TP, W] (TP = T rounded up to a power of two)
read in one round trip at the start, then taken out one token at a time. Loaded token by token instead,
each token's loads would wait behind the stores of the token before (the compiler cannot move a load
above a store it cannot prove elsewhere), one memory round trip a token.

Mamba2's verify (`mamba2/triton_verify.py`) loads so; the delta-rule verify kernels load token by token.
They loaded so too for a while (at fbc7116, with GDN's history folded on the tensor cores), reverted on a
spill count from a compile that left every stride unknown; compiled with the launch's own specialisation
(`benchmarks/kernel_registers.py`, sm_90, T = 4, batch 64, one warp) that version did not spill at BV 16
(GDN 254 registers, KDA 227); at KDA's BV 32 it spilled more (456 bytes a thread) than the token-by-token
form. Neither form has been timed on the H200 against the other."""
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
