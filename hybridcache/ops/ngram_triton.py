"""The n-gram drafter's device search (`NgramDrafter.propose_on_device`) as one Triton launch, and the
append of a verify step's accepted tokens to asynchronous verify's device history (`TokenHistory.append`).

The torch form is about 50 small launches a verify step, most of an asynchronous verify step's host time
outside the model at batch 1. Here one program takes one row: it scores every candidate continuation start
c (0..W) by the run of tokens before c that equal the row's last tokens (up to N = max_n), keeps the best
score n·(W + 1) + c over blocks of candidates (the longest match, then the latest start), and writes the k
drafts and how many of them are real. Integer work only: the same drafts as the torch form, bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl_triton import pdl_entry, pdl_launch

BLOCK_C = 256


@triton.jit
def _ngram_kernel(hist_ptr, len_ptr, drafts_ptr, proposed_ptr, W, stride_r,
                  N: tl.constexpr, MIN_N: tl.constexpr, K: tl.constexpr, BLOCK_C: tl.constexpr,
                  BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    row = tl.program_id(0)
    base = hist_ptr + row.to(tl.int64) * stride_r
    L = tl.load(len_ptr + row)
    best = tl.full([BLOCK_C], -1, tl.int64)
    for c0 in range(0, W + 1, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        alive = c <= W
        run = tl.zeros([BLOCK_C], tl.int64)
        for i in tl.static_range(N):  # history[c - 1 - i] against history[L - 1 - i], left of column 0 no match
            at = c - 1 - i
            mine = tl.load(base + at, mask=alive & (at >= 0), other=-2)
            tail = tl.load(base + (L - 1 - i), mask=L - 1 - i >= 0, other=-3)
            alive = alive & (mine == tail)
            run += alive.to(tl.int64)
        n = tl.minimum(tl.minimum(run, L - 1), c.to(tl.int64))
        ok = (n >= MIN_N) & (c <= L - 1)
        best = tl.maximum(best, tl.where(ok, n * (W + 1) + c, -1))
    top = tl.max(best, 0)
    start = tl.where(top >= 0, top % (W + 1), -1)
    j = tl.arange(0, BLOCK_K)
    upto = tl.maximum(tl.minimum(start + j, L - 1), 0)
    last = tl.load(base + (L - 1))
    drafts = tl.where(start >= 0, tl.load(base + upto, mask=j < K, other=0), last)
    tl.store(drafts_ptr + row.to(tl.int64) * K + j, drafts, mask=j < K)
    tl.store(proposed_ptr + row, tl.where(start >= 0, tl.minimum(L - start, K), 0))


@triton.jit
def _append_kernel(hist_ptr, len_ptr, tok_ptr, count_ptr, last_ptr, W, stride_r, stride_t, T: tl.constexpr,
                   BLOCK_T: tl.constexpr, PDL: tl.constexpr):
    pdl_entry(PDL)
    row = tl.program_id(0)
    base = hist_ptr + row.to(tl.int64) * stride_r
    L = tl.load(len_ptr + row)
    c = tl.load(count_ptr + row)
    t = tl.arange(0, BLOCK_T)
    new = tl.load(tok_ptr + row.to(tl.int64) * stride_t + t, mask=t < T, other=0)
    tl.store(base + tl.minimum(L + t, W - 1), new, mask=t < c)
    tl.store(len_ptr + row, L + c)
    # the last token from the inputs, not read back from history (another thread of the program wrote it)
    last = tl.where(c > 0, tl.load(tok_ptr + row.to(tl.int64) * stride_t + tl.maximum(c - 1, 0)),
                    tl.load(base + tl.maximum(L - 1, 0)))
    tl.store(last_ptr + row, last)


def history_append_triton(history: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor,
                          counts: torch.Tensor) -> torch.Tensor:
    """`TokenHistory.append`: row i's first counts[i] of tokens [R, T] (any row stride) written at its
    lengths[i] (clamped to the last of history's W columns), lengths += counts, in place. Returns each
    row's last token [R]. history [R, W] int64 with a unit last stride."""
    tokens = tokens if tokens.stride(-1) == 1 else tokens.contiguous()  # rows read in place, e.g. a wider block's
    R, T = tokens.shape
    last = torch.empty(R, dtype=torch.int64, device=history.device)
    if R:
        _append_kernel[(R,)](history, lengths, tokens, counts, last, history.shape[1], history.stride(0),
                             tokens.stride(0), T=T, BLOCK_T=triton.next_power_of_2(T), **pdl_launch(history))
    return last


def ngram_propose_triton(history: torch.Tensor, lengths: torch.Tensor, k: int, max_n: int,
                         min_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`NgramDrafter.propose_on_device`: history [R, W] int64 (unit last stride), lengths [R] int64 >= 1;
    returns drafts [R, k] int64 and the real drafts' count [R] int64."""
    R, W = history.shape
    drafts = torch.empty(R, k, dtype=torch.int64, device=history.device)
    proposed = torch.empty(R, dtype=torch.int64, device=history.device)
    if R:
        _ngram_kernel[(R,)](history, lengths, drafts, proposed, W, history.stride(0), N=max_n, MIN_N=min_n, K=k,
                            BLOCK_C=BLOCK_C, BLOCK_K=triton.next_power_of_2(k), **pdl_launch(history))
    return drafts, proposed
