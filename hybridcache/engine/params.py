"""User-facing parameters: sampling and speculative decoding.

Both refuse a bad field at construction with `InvalidParamsError`, before anything is queued.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real

MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI's API allows
MIN_TEMPERATURE = 1e-2  # below this, dividing logits by it only amplifies noise: use 0 (greedy)


class InvalidParamsError(ValueError):
    """A `SamplingParams` or `SpeculativeConfig` field out of its domain; nothing was constructed."""


def _int(name: str, value: object) -> int:
    """`value` as an int; a bool, float or string is refused (True is not 1 token, 2.0 is not a count)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidParamsError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    return int(value)


def _finite(name: str, value: object) -> float:
    """`value` as a finite float; an int is accepted, a bool or string is not."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidParamsError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise InvalidParamsError(f"{name} must be finite, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. `temperature == 0` is greedy; `top_k == 0` and `top_p == 1` disable them."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    stop: tuple[str, ...] = field(default_factory=tuple)  # text that ends the request (needs a tokenizer)
    logprobs: int | None = None  # the sampled token's logprob plus this many top alternatives per token

    def __post_init__(self) -> None:
        max_tokens = _int("max_tokens", self.max_tokens)
        if max_tokens < 1:
            raise InvalidParamsError(f"max_tokens must be >= 1, got {max_tokens}")
        temperature = _finite("temperature", self.temperature)
        if temperature < 0:
            raise InvalidParamsError(f"temperature must be >= 0, got {temperature!r}")
        if 0 < temperature < MIN_TEMPERATURE:
            raise InvalidParamsError(
                f"temperature must be 0 or >= {MIN_TEMPERATURE}, got {temperature!r}; use 0 for greedy"
            )
        top_p = _finite("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise InvalidParamsError(f"top_p must be in (0, 1], got {top_p!r}")
        top_k = _int("top_k", self.top_k)
        if top_k < 0:
            raise InvalidParamsError(f"top_k must be >= 1, or 0 to disable, got {top_k}")
        seed = None if self.seed is None else _int("seed", self.seed)
        if seed is not None and not 0 <= seed < 2**64:
            raise InvalidParamsError(f"seed must be None or an int in [0, 2**64), got {seed}")
        stop_token_ids = self._stop_token_ids()
        if not isinstance(self.ignore_eos, bool):  # "no" would be truthy
            kind = type(self.ignore_eos).__name__
            raise InvalidParamsError(f"ignore_eos must be a bool, got {self.ignore_eos!r} ({kind})")
        stop = self._stop()
        logprobs = None if self.logprobs is None else _int("logprobs", self.logprobs)
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise InvalidParamsError(f"logprobs must be None or in [0, {MAX_LOGPROBS}], got {logprobs}")
        for name, value in [("max_tokens", max_tokens), ("temperature", temperature), ("top_p", top_p),
                            ("top_k", top_k), ("seed", seed), ("stop_token_ids", stop_token_ids), ("stop", stop),
                            ("logprobs", logprobs)]:
            object.__setattr__(self, name, value)

    def _stop_token_ids(self) -> tuple[int, ...]:
        raw = self.stop_token_ids
        if isinstance(raw, (str, bytes)) or not hasattr(raw, "__iter__"):
            raise InvalidParamsError(f"stop_token_ids must be a sequence of ints, got {raw!r} ({type(raw).__name__})")
        ids = tuple(_int("stop_token_ids entry", t) for t in raw)
        bad = [t for t in ids if t < 0]
        if bad:
            raise InvalidParamsError(f"stop_token_ids must be >= 0, got {bad[0]} in {ids}")
        return ids

    def _stop(self) -> tuple[str, ...]:
        raw = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not hasattr(raw, "__iter__") or isinstance(raw, bytes):
            raise InvalidParamsError(f"stop must be a string or a sequence of strings, got {raw!r}")
        stop = tuple(raw)
        for s in stop:
            if not isinstance(s, str) or not s:
                raise InvalidParamsError(f"stop strings must be non-empty strings, got {s!r}")
        return stop

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: `method="ngram"` proposes `num_draft_tokens` by prompt lookup, matching the
    longest suffix of `max_ngram`..`min_ngram` tokens earlier in the sequence. A request whose drafts keep
    being rejected stops proposing for up to `backoff_max_steps` steps (`drafter.DraftBackoff`): a verify
    step of k + 1 tokens a row costs 1.3-1.7x a decode step from batch 16 on an H200, so drafts that never
    pass would cost that much; backing off keeps it within a few percent (docs/benchmarks.md). 0: every
    step drafts."""

    method: str = "ngram"
    num_draft_tokens: int = 3
    max_ngram: int = 4
    min_ngram: int = 1
    backoff_max_steps: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or self.method != "ngram":
            raise InvalidParamsError(f"unknown speculative method {self.method!r}; supported: 'ngram'")
        num_draft_tokens = _int("num_draft_tokens", self.num_draft_tokens)
        if num_draft_tokens < 1:
            raise InvalidParamsError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        max_ngram, min_ngram = _int("max_ngram", self.max_ngram), _int("min_ngram", self.min_ngram)
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidParamsError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        backoff = _int("backoff_max_steps", self.backoff_max_steps)
        if backoff < 0:
            raise InvalidParamsError(f"backoff_max_steps must be >= 0, got {backoff}")
        for name, value in [("num_draft_tokens", num_draft_tokens), ("max_ngram", max_ngram), ("min_ngram", min_ngram),
                            ("backoff_max_steps", backoff)]:
            object.__setattr__(self, name, value)


def check_engine_args(counts: dict[str, int], page_size: int, prefix_snapshot_interval: int | None,
                      timeouts: dict[str, float]) -> None:
    """The LLM's numeric arguments (InvalidParamsError): every count an int >= 1,
    the snapshot interval a positive multiple of the page size, every timeout > 0."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidParamsError(f"{name} must be an int >= 1, got {value!r}")
    if prefix_snapshot_interval is not None and (
            isinstance(prefix_snapshot_interval, bool) or not isinstance(prefix_snapshot_interval, int)
            or prefix_snapshot_interval < 1 or prefix_snapshot_interval % page_size):
        raise InvalidParamsError(f"prefix_snapshot_interval must be a positive multiple of page_size {page_size}, "
                                 f"got {prefix_snapshot_interval!r}")
    for name, value in timeouts.items():
        if not value > 0:
            raise InvalidParamsError(f"{name} must be > 0, got {value!r}")
