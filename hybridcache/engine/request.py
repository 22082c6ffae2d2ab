"""A request in the engine: its tokens and its sampling state. Its lifecycle status is the planner's."""
from __future__ import annotations

from dataclasses import dataclass, field

from .params import SamplingParams


@dataclass(eq=False)
class Request:
    req_id: int
    prompt: list[int]
    params: SamplingParams
    eos_token_id: int | None
    arrival: int
    output: list[int] = field(default_factory=list)
    num_prefilled: int = 0  # tokens of `tokens` in the cache
    seed: int = 0  # int64 bits of the sampling seed: draws hash (seed, position), see device_sampler
    finished: bool = False

    @property
    def tokens(self) -> list[int]:
        """Prompt plus generated tokens; the last one is not yet in the cache while decoding."""
        return self.prompt + self.output

    @property
    def context_len(self) -> int:
        """Tokens the context phase must put in the cache: everything but the last generated token."""
        return len(self.prompt) + max(len(self.output) - 1, 0)

    def append(self, tokens: list[int]) -> bool:
        """Add generated tokens, stopping at a stop token or max_tokens; returns True when finished."""
        stops = set(self.params.stop_token_ids)
        if self.eos_token_id is not None and not self.params.ignore_eos:
            stops.add(self.eos_token_id)
        for t in tokens:
            self.output.append(t)
            if t in stops or len(self.output) >= self.params.max_tokens:
                self.finished = True
                return True
        return False


@dataclass(frozen=True)
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None = None
