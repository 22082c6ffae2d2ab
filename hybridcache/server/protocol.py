"""Request bodies of the OpenAI-compatible API (pydantic) and their translation to `SamplingParams`.

Fields the API defines but we do not serve (n > 1, best_of, echo, ...) are refused with a 400, never
ignored silently; unknown fields are ignored, as OpenAI clients send extras."""
from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ..engine.params import SamplingParams


class BadRequest(ValueError):
    """A request the API refuses with 400; `param` names the field."""

    status, kind = 400, "invalid_request_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(BadRequest):
    """The request names a model this server does not serve: 404, as OpenAI's API answers."""

    status, kind = 404, "model_not_found"


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: StrictInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None  # not OpenAI's; vLLM's extension
    seed: StrictInt | None = None
    stop: Union[StrictStr, list[StrictStr], None] = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: bool = False
    n: StrictInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # vLLM's extension: token ids beside the text

    def sampling_params(self, defaults: SamplingParams, logprobs: int | None) -> SamplingParams:
        if self.n != 1:
            raise BadRequest(f"n must be 1 (this server generates one choice per request), got {self.n}", "n")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        pick = lambda value, default: default if value is None else value  # noqa: E731
        return SamplingParams(
            max_tokens=pick(self.max_tokens, defaults.max_tokens),
            temperature=pick(self.temperature, defaults.temperature),
            top_p=pick(self.top_p, defaults.top_p),
            top_k=pick(self.top_k, defaults.top_k),
            seed=self.seed,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            stop=stop,
            logprobs=logprobs,
        )


class CompletionRequest(_Sampling):
    prompt: Union[StrictStr, list[StrictInt], list[StrictStr], list[list[StrictInt]]]
    logprobs: StrictInt | None = None
    echo: bool = False
    best_of: StrictInt | None = None

    def one_prompt(self) -> str | list[int]:
        if self.echo:
            raise BadRequest("echo is not supported", "echo")
        if self.best_of not in (None, 1):
            raise BadRequest("best_of must be 1", "best_of")
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise BadRequest(f"one prompt per request, got a batch of {len(p)}", "prompt")
            p = p[0]
        return p


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: StrictStr
    content: Union[StrictStr, list[dict[str, Any]], None] = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    logprobs: bool = False
    top_logprobs: StrictInt | None = None

    def num_logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def conversation(self) -> list[dict[str, Any]]:
        out = []
        for m in self.messages:
            content = m.content
            if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
                if any(part.get("type") != "text" for part in content):
                    raise BadRequest("only text content parts are supported", "messages")
                content = "".join(str(part.get("text", "")) for part in content)
            out.append({"role": m.role, "content": content or ""})
        return out
