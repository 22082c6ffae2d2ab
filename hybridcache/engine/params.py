"""User-facing parameters: sampling and speculative decoding."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. `temperature == 0` is greedy; `top_k <= 0` and `top_p == 1` disable them."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: `method="ngram"` proposes `num_draft_tokens` by prompt lookup, matching the
    longest suffix of `max_ngram`..`min_ngram` tokens earlier in the sequence."""

    method: str = "ngram"
    num_draft_tokens: int = 3
    max_ngram: int = 4
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"unknown speculative method {self.method!r}; supported: 'ngram'")
        if self.num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
