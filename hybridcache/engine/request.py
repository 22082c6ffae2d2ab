"""A request in the engine: its tokens, its sampling state and its text. Its cache lifecycle status is the
planner's; `finish_reason` says why it ended ('stop', 'length' or 'abort')."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .params import SamplingParams

FINISH_REASONS = ("stop", "length", "abort")


class TokenLogprob(NamedTuple):
    """One generated token's log-probability under the model (before temperature, top-k, top-p) and the
    `top` most likely tokens at its position as (token id, logprob), likeliest first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(eq=False)
class Request:
    req_id: int
    prompt: list[int]
    params: SamplingParams
    eos_token_ids: tuple[int, ...]
    arrival: int
    output: list[int] = field(default_factory=list)
    num_prefilled: int = 0  # tokens of `tokens` in the cache
    num_pending: int = 0  # tokens sampled and committed by asynchronous decode steps, not yet read back
    seed: int = 0  # int64 bits of the sampling seed: draws hash (seed, position), see device_sampler
    finished: bool = False
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per output token when params.logprobs is set
    text: str = ""  # the decoded output (special tokens skipped), cut before a stop string
    num_tokens_sent: int = 0  # output tokens, logprobs and text characters already handed out as deltas
    num_text_sent: int = 0
    draft_misses: int = 0  # speculation back-off (`drafter.DraftBackoff`): verify steps in a row that accepted no draft
    draft_skip: int = 0  # steps left that propose no drafts

    @property
    def tokens(self) -> list[int]:
        """Prompt plus generated tokens; the last one is not yet in the cache while decoding."""
        return self.prompt + self.output

    @property
    def last_token(self) -> int:
        """`tokens[-1]` without building the list."""
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def context_len(self) -> int:
        """Tokens the context phase must put in the cache: everything but the last generated token (which
        may still be on its way back from the device: `num_pending`)."""
        return len(self.prompt) + max(len(self.output) + self.num_pending - 1, 0)

    def append(self, tokens: list[int], logprobs: list[TokenLogprob] | None = None) -> bool:
        """Add generated tokens, stopping at a stop token or max_tokens; returns True when finished."""
        stops = set(self.params.stop_token_ids)
        if not self.params.ignore_eos:
            stops.update(self.eos_token_ids)
        for i, t in enumerate(tokens):
            self.output.append(t)
            if logprobs is not None:
                if self.logprobs is None:
                    self.logprobs = []
                self.logprobs.append(logprobs[i])
            if t in stops:
                self.finish("stop")
                return True
            if len(self.output) >= self.params.max_tokens:
                self.finish("length")
                return True
        return False

    def finish(self, reason: str) -> None:
        assert reason in FINISH_REASONS, reason
        self.finished, self.finish_reason = True, reason

    def update_text(self, tokenizer: Any) -> bool:
        """Decode the output (special tokens skipped); True when a stop string appears in it, the text
        then ending right before the first one."""
        text = tokenizer.decode(self.output, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in self.params.stop) if i >= 0]
        self.text = text[: min(cuts)] if cuts else text
        return bool(cuts)

    def take_delta(self, has_text: bool) -> "RequestDelta":
        """What this request produced since its last delta. While it runs, text that a stop string could
        still claim, or a character still incomplete, is held back."""
        text = None
        if has_text:
            ready = self.text
            if not self.finished:
                hold = max(map(len, self.params.stop), default=1) - 1
                ready = ready[: len(ready) - hold] if hold else ready
                ready = ready.rstrip("\ufffd")
            text = ready[self.num_text_sent:] if len(ready) > self.num_text_sent else ""
            self.num_text_sent = max(self.num_text_sent, len(ready))
        start, self.num_tokens_sent = self.num_tokens_sent, len(self.output)
        logprobs = None if self.logprobs is None else self.logprobs[start:]
        return RequestDelta(self.req_id, self.output[start:], text, self.finish_reason, logprobs,
                            len(self.prompt), len(self.output))


@dataclass(frozen=True)
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None = None
    finish_reason: str | None = None  # 'stop' (eos, a stop token or string), 'length' (max_tokens) or 'abort'
    logprobs: list[TokenLogprob] | None = None  # per output token, when SamplingParams.logprobs is set


@dataclass(frozen=True)
class RequestDelta:
    """One request's progress in one engine step: its new tokens (and logprobs), its new text (None without
    a tokenizer) and, on its last delta, why it finished."""

    request_id: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None
    num_prompt_tokens: int
    num_output_tokens: int

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
