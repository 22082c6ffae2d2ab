"""Prompt-lookup (n-gram) drafting: propose the tokens that followed the last match of the current suffix;
and the back-off that stops proposing for a request whose drafts keep being rejected."""
from __future__ import annotations

from array import array

import torch

from ..ops.triton_support import runs_triton
from .params import SpeculativeConfig
from .request import Request


class DraftBackoff:
    """After a verify step that rejected every draft of a request (its `draft_misses`-th such step in a row),
    the request proposes nothing for its next min(2^misses - 1, `max_steps`) steps, which run as plain decode
    steps (asynchronous where the engine schedules so); a step that accepts a draft resets the count.
    Greedy tokens do not depend on drafts, so they are unchanged. `max_steps` 0: every step drafts."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    @staticmethod
    def drafts(req: Request) -> bool:
        """Whether `req` proposes drafts at its next step."""
        return req.draft_skip == 0

    def after_step(self, req: Request, num_drafts: int, num_accepted: int) -> None:
        """`req` ran a generation step with `num_drafts` drafts, of which it accepted `num_accepted`."""
        if req.draft_skip:
            req.draft_skip -= 1
        elif num_drafts and self.max_steps:
            req.draft_misses = 0 if num_accepted else min(req.draft_misses + 1, 30)
            req.draft_skip = min(2 ** req.draft_misses - 1, self.max_steps)


class NgramDrafter:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.num_draft_tokens
        self.max_n, self.min_n = config.max_ngram, config.min_ngram
        self.backoff = DraftBackoff(config.backoff_max_steps)

    def propose(self, tokens: list[int]) -> list[int]:
        """Up to `k` tokens: the continuation of the most recent earlier occurrence of the longest suffix
        (of `max_n` down to `min_n` tokens) of `tokens`. Empty when nothing matches.

        The search runs in C: the tokens as 4-byte words, each suffix looked for with `bytes.rfind` in the
        words before the last (an occurrence must leave a token after it), a hit that does not start on a
        word boundary skipped: the same answer as `scan_propose`, 20x faster from 1,000 tokens
        (`benchmarks/ngram_drafter.py`), which matters per row and step on the host."""
        n_tok = len(tokens)
        words = array("i", tokens).tobytes()
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            suffix = words[(n_tok - n) * 4 :]
            end = (n_tok - 1) * 4  # an occurrence at token s ends by token n_tok - 1: s + n <= n_tok - 1
            while (at := words.rfind(suffix, 0, end)) >= 0:
                if at % 4 == 0:
                    start = at // 4 + n
                    return tokens[start : start + self.k]
                end = at + len(suffix) - 1  # straddles words: look before it
        return []

    @property
    def drafts_on_device(self) -> bool:
        """Whether `propose_on_device` proposes what `propose` does: not when `propose` alone was replaced
        on this instance (a test's or a benchmark's drafter); then every verify step drafts on the host."""
        return "propose" not in vars(self) or "propose_on_device" in vars(self)

    def propose_on_device(self, history: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`pad(propose(tokens), tokens[-1], k)` for every row at once, on the device, no host sync, in a
        fixed number of launches: history [R, W] int64 (row i's tokens in its first lengths[i] columns,
        lengths >= 1, tokens >= 0); returns drafts [R, k] int64 and how many of them `propose` gave [R]
        (the rest is padding).

        Each candidate continuation start c (0..W) is scored by how many tokens before it match the row's
        suffix: the run of equal tokens at the right end of the windows history[c - N : c] and
        history[L - N : L] (N = max_n; left of column 0 a token no row holds). The longest match n that
        fits (n <= L - 1, n <= c, c <= L - 1, n >= min_n) wins, the latest c among equals, as `propose`
        tries the longest suffix first and takes its last occurrence. On CUDA one Triton launch
        (`ops/ngram_triton.py`, the same integers) replaces the ~50 launches of the torch form."""
        if runs_triton(history) and history.stride(1) == 1:
            from ..ops.ngram_triton import ngram_propose_triton

            return ngram_propose_triton(history, lengths.contiguous(), self.k, self.max_n, self.min_n)
        R, W = history.shape
        N, k, device = self.max_n, self.k, history.device
        padded = torch.cat([history.new_full((R, N), -2), history], 1)  # [R, N + W]
        windows = padded.unfold(1, N, 1)  # [R, W + 1, N]: windows[:, c] = history[c - N : c]
        suffix = windows.gather(1, lengths[:, None, None].expand(R, 1, N))  # [R, 1, N]
        run = (windows == suffix).flip(-1).int().cumprod(-1).sum(-1)  # [R, W + 1] matched tokens before c
        c = torch.arange(W + 1, device=device)
        n = torch.minimum(torch.minimum(run, lengths[:, None] - 1), c)
        ok = (n >= self.min_n) & (c <= lengths[:, None] - 1)
        score = torch.where(ok, n * (W + 1) + c, -1)
        best = score.amax(-1)  # [R]
        start = torch.where(best >= 0, best % (W + 1), -1)  # where the continuation starts
        j = torch.arange(k, device=device)
        # a continuation shorter than k repeats its last token; no match repeats the row's last token
        upto = torch.minimum(start[:, None] + j, lengths[:, None] - 1)
        drafts = history.gather(1, upto.clamp(min=0))
        last = history.gather(1, (lengths - 1)[:, None])  # [R, 1]
        proposed = torch.where(start >= 0, (lengths - start).clamp(max=k), 0)
        return torch.where(start[:, None] >= 0, drafts, last), proposed

    @staticmethod
    def pad(drafts: list[int], last_token: int, length: int) -> list[int]:
        """`drafts` padded to `length` by repeating its last token (or `last_token` when empty).

        Padding gives the step's rows one verify shape; a padded draft is an ordinary proposal, accepted
        only when the model agrees with it, so outputs are unchanged."""
        fill = drafts[-1] if drafts else last_token
        return drafts + [fill] * (length - len(drafts))


def scan_propose(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """`NgramDrafter.propose` as a plain scan: the reference it is tested and measured against."""
    n_tok = len(tokens)
    for n in range(min(max_n, n_tok - 1), min_n - 1, -1):
        suffix = tokens[n_tok - n :]
        for start in range(n_tok - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []
