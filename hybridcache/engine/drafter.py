"""Prompt-lookup (n-gram) drafting: propose the tokens that followed the last match of the current suffix."""
from __future__ import annotations

from .params import SpeculativeConfig


class NgramDrafter:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.num_draft_tokens
        self.max_n, self.min_n = config.max_ngram, config.min_ngram

    def propose(self, tokens: list[int]) -> list[int]:
        """Up to `k` tokens: the continuation of the most recent earlier occurrence of the longest suffix
        (of `max_n` down to `min_n` tokens) of `tokens`. Empty when nothing matches."""
        n_tok = len(tokens)
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            suffix = tokens[n_tok - n :]
            for start in range(n_tok - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    follow = tokens[start + n : start + n + self.k]
                    if follow:
                        return follow
        return []

    @staticmethod
    def pad(drafts: list[int], last_token: int, length: int) -> list[int]:
        """`drafts` padded to `length` by repeating its last token (or `last_token` when empty).

        Padding gives the step's rows one verify shape; a padded draft is an ordinary proposal, accepted
        only when the model agrees with it, so outputs are unchanged."""
        fill = drafts[-1] if drafts else last_token
        return drafts + [fill] * (length - len(drafts))
