"""Prompts for `bench serve`: random or shared-prefix, as token-id lists (completions) or words (chat).

Token-id prompts need no tokenizer on the client: `/v1/completions` takes a list of ints as its
prompt. Chat messages must be text, so there a prompt is `input_len` words drawn from WORDS (about one
token each for most tokenizers).
"""
from __future__ import annotations

import random
from typing import Union

Prompt = Union[list[int], str]

WORDS = ("the", "a", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "with", "as", "at",
         "by", "this", "from", "or", "an", "but", "not", "what", "all", "were", "when", "we", "there",
         "can", "time", "if", "will", "each", "about", "how", "up", "out", "them", "then", "she", "many",
         "some", "so", "these", "would", "other", "into", "has", "more", "her", "two", "like", "him", "see",
         "could", "no", "make", "than", "first", "been", "its", "who", "now", "people", "my", "made", "over",
         "did", "down", "only", "way", "find", "use", "may", "water", "long", "little", "very", "after")


def _tokens(rng: random.Random, n: int, low: int, high: int, text: bool) -> list:
    if text:
        return [rng.choice(WORDS) for _ in range(n)]
    return [rng.randrange(low, high) for _ in range(n)]


def _finish(parts: list, text: bool) -> Prompt:
    return " ".join(parts) if text else parts


def random_prompts(num: int, input_len: int, *, seed: int, text: bool, low: int, high: int) -> list[Prompt]:
    """`num` prompts of `input_len` token ids in [low, high) (or `input_len` words when `text`)."""
    rng = random.Random(seed)
    return [_finish(_tokens(rng, input_len, low, high, text), text) for _ in range(num)]


def shared_prefix_prompts(num: int, prefix_len: int, num_prefixes: int, suffix_len: int, *, seed: int,
                          text: bool, low: int, high: int) -> list[Prompt]:
    """`num` prompts: prompt i is prefix `i % num_prefixes` (`prefix_len` tokens) + its own random suffix
    (`suffix_len` tokens), so a server with prefix caching can reuse each prefix."""
    if num_prefixes < 1:
        raise ValueError(f"num_prefixes must be >= 1, got {num_prefixes}")
    rng = random.Random(seed)
    prefixes = [_tokens(rng, prefix_len, low, high, text) for _ in range(num_prefixes)]
    return [_finish(prefixes[i % num_prefixes] + _tokens(rng, suffix_len, low, high, text), text)
            for i in range(num)]
