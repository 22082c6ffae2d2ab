"""The main job's workload: deterministic prompts with repeated motifs (so n-gram drafts get accepted)."""
from __future__ import annotations

import random


def make_prompts(num_requests: int, vocab_size: int, seed: int = 0, min_len: int = 24, max_len: int = 64) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(num_requests):
        motif = [rng.randrange(vocab_size) for _ in range(rng.randint(3, 8))]
        length = rng.randint(min_len, max_len)
        tokens: list[int] = []
        while len(tokens) < length:
            tokens += motif if rng.random() < 0.7 else [rng.randrange(vocab_size)]
        prompts.append(tokens[:length])
    return prompts
