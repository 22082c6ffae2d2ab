"""What a request must be to be admitted: a prompt as token ids, and the limits checked before anything changes
(InvalidRequestError, RequestTooLargeError)."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..cache import HybridCacheManager, Sizing
from .errors import InvalidRequestError, RequestTooLargeError
from .params import SamplingParams
from .policy import DemandSplit


class RequestCheck:
    """Reads only what a step never changes (the vocabulary, the cache's budget and split rule), so another
    thread may call it while the LLM runs; the tokenizer is used under `tokenizer_lock`."""

    def __init__(self, tokenizer: Any, tokenizer_lock: threading.Lock, vocab_size: int, max_model_len: int,
                 verify_tokens: int, manager: HybridCacheManager, sizing: Sizing, split: DemandSplit) -> None:
        self.tokenizer, self.tokenizer_lock = tokenizer, tokenizer_lock
        self.vocab_size, self.max_model_len, self.verify_tokens = vocab_size, max_model_len, verify_tokens
        self.manager, self.sizing, self.split = manager, sizing, split

    def encode(self, prompt: Sequence[int] | str) -> list[int]:
        """Text through the tokenizer, or a sequence of ints as they are."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError("this checkpoint has no tokenizer: pass token ids, not text")
            with self.tokenizer_lock:
                return list(self.tokenizer.encode(prompt))
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
            raise InvalidRequestError(f"a prompt is text or a list of token ids, got {type(prompt).__name__}")
        bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, (int, np.integer))]
        if bad:
            raise InvalidRequestError(f"token ids must be ints, got {bad[0]!r} ({type(bad[0]).__name__})")
        return [int(t) for t in prompt]

    def validate(self, ids: list[int], params: SamplingParams) -> None:
        """Raises unless a request of these ids and params can run, alone, in this cache."""
        if not ids:
            raise InvalidRequestError("empty prompt")
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer; this checkpoint has none (use stop_token_ids)")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise InvalidRequestError(f"prompt ({len(ids)}) + max_tokens ({params.max_tokens}) = {total} exceeds "
                                      f"max_model_len {self.max_model_len}")
        config = self.manager.config
        need = self.manager.device_bytes_needed(total + self.verify_tokens)
        need += self.sizing.bytes_for(config.num_snapshot_slots, 0)  # carved beside the requests
        if need > config.device_bytes:
            raise RequestTooLargeError(f"a request of {total} tokens needs {need} device bytes even alone; the "
                                       f"device cache holds {config.device_bytes}")
        pages = self.split.whole_pages_of(len(ids), params.max_tokens)
        if not self.split.follow_demand and pages > self.manager.num_pages:
            raise RequestTooLargeError(
                f"a request of {total} tokens needs {pages} pages; the fixed split (num_slots="
                f"{self.manager.num_slots}) leaves the device cache {self.manager.num_pages}"
            )
