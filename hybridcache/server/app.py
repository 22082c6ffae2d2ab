"""The OpenAI-compatible server: FastAPI routes over one `EngineCore`.

  POST /v1/completions, /v1/chat/completions (stream: SSE chunks, then `data: [DONE]`)
  GET  /v1/models, /health, /metrics

A request is submitted to the core before the response starts, so refusals are plain 400 (bad input) or
503 (queue full) with OpenAI's error body. A client that goes away aborts its request (a streaming
response is cancelled; a plain one watches for the disconnect message while it waits).
"""
from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..engine.core import DeltaStream, EngineCore, EngineStoppedError, QueueFullError
from ..engine.errors import InvalidRequestError
from ..engine.llm import LLM
from ..engine.params import InvalidParamsError
from ..engine.request import RequestDelta, TokenLogprob
from .metrics import Metrics, RequestTimer
from .protocol import BadRequest, ChatCompletionRequest, CompletionRequest, ModelNotFound



def error_response(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


def build_app(llm: LLM, model_name: str, max_queued: int | None = None) -> FastAPI:
    """An app serving `llm`; its core thread starts and stops with the app's lifespan."""
    core = EngineCore(llm, max_queued)
    metrics = Metrics(core, model_name)
    # the server's own copy: the core's thread decodes with the LLM's while requests are templated here
    tok = copy.deepcopy(llm.tokenizer)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        core.start()
        try:
            yield
        finally:
            core.shutdown()

    app = FastAPI(title="hybridcache", lifespan=lifespan)
    app.state.core, app.state.metrics, app.state.llm = core, metrics, llm

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        return error_response(400, f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid request')}",
                              "invalid_request_error", ".".join(loc) or None)

    @app.exception_handler(BadRequest)
    async def _bad(request: Request, exc: BadRequest) -> JSONResponse:
        return error_response(exc.status, str(exc), exc.kind, exc.param)

    @app.exception_handler(InvalidParamsError)
    @app.exception_handler(InvalidRequestError)
    async def _refused(request: Request, exc: Exception) -> JSONResponse:
        return error_response(400, str(exc), "invalid_request_error")

    @app.exception_handler(QueueFullError)
    @app.exception_handler(EngineStoppedError)
    async def _busy(request: Request, exc: Exception) -> JSONResponse:
        return error_response(503, str(exc), "service_unavailable")

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise ModelNotFound(f"model {name!r} is not served here; this server serves {model_name!r}", "model")

    @app.get("/health")
    async def health() -> Response:
        if not core.is_running:
            return error_response(503, "the engine core is not running", "service_unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def get_metrics() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "hybridcache", "max_model_len": llm.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_model(body.model)
        prompt = body.one_prompt()
        params = body.sampling_params(llm.default_params, body.logprobs)
        return await respond(request, body, prompt, params, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        check_model(body.model)
        if tok is None or getattr(tok, "chat_template", None) is None:
            raise BadRequest("this model has no chat template (its checkpoint has no tokenizer with one); "
                             "use /v1/completions", "messages")
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        params = body.sampling_params(llm.default_params, body.num_logprobs())
        try:
            text = tok.apply_chat_template(body.conversation(), tokenize=False, add_generation_prompt=True)
        except Exception as e:  # a template that rejects the conversation (roles out of order, ...)
            raise BadRequest(f"the chat template refused the messages: {e}", "messages") from e
        prompt = list(tok.encode(text, add_special_tokens=False))
        return await respond(request, body, prompt, params, chat=True)

    async def respond(request: Request, body, prompt, params, chat: bool) -> Response:
        arrival = time.perf_counter()
        stream = core.open(prompt, params)  # raises 400 / 503 before any byte is sent
        timer = RequestTimer(metrics, arrival, stream.num_prompt_tokens)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        fmt = _Formatter(tok, chat, rid, created, model_name, body.return_token_ids)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return _EventStream(sse(stream, timer, fmt, usage), lambda: end(stream, timer))
        deltas = []
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while not stream.finished:
                nxt = asyncio.ensure_future(stream.next())
                await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():  # the client left
                    nxt.cancel()
                    break
                d = nxt.result()
                timer.observe(d, time.perf_counter())
                deltas.append(d)
        finally:
            gone.cancel()
            end(stream, timer)
        return JSONResponse(fmt.whole(deltas))

    async def sse(stream: DeltaStream, timer: RequestTimer, fmt: "_Formatter", usage: bool) -> AsyncIterator[str]:
        try:
            if fmt.chat:
                yield _event(fmt.chunk(None, first=True))
            last = None
            async for d in stream:
                timer.observe(d, time.perf_counter())
                last = d
                if d.token_ids or d.text or d.finished:
                    yield _event(fmt.chunk(d))
            if usage and last is not None:
                yield _event(fmt.usage_chunk(last))
            yield "data: [DONE]\n\n"
        finally:
            end(stream, timer)

    def end(stream: DeltaStream, timer: RequestTimer) -> None:
        """The response is over: abort the request if it is still running, and give back its place."""
        stream.close()
        timer.finish("abort", time.perf_counter())  # a no-op when it finished

    return app


class _EventStream(StreamingResponse):
    """SSE whose `on_end` runs however the response ends: a client that leaves before the body starts
    cancels the body's generator before it runs, so the generator's own `finally` never would."""

    def __init__(self, body: AsyncIterator[str], on_end: Callable[[], None]) -> None:
        super().__init__(body, media_type="text/event-stream")
        self.on_end = on_end

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_end()


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body is read already: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class _Formatter:
    """OpenAI response objects from deltas."""

    def __init__(self, tok: Any, chat: bool, rid: str, created: int, model: str, token_ids: bool) -> None:
        self.tok, self.chat, self.rid, self.created, self.model, self.token_ids = tok, chat, rid, created, model, token_ids
        self.offset = 0  # text offset for completion logprobs

    def _head(self, obj: str) -> dict:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}

    def token_text(self, token_id: int) -> str:
        return self.tok.decode([token_id]) if self.tok is not None else f"token_id:{token_id}"

    def logprobs(self, lps: list[TokenLogprob] | None) -> dict | None:
        if lps is None:
            return None
        if self.chat:
            def entry(t: int, lp: float) -> dict:
                s = self.token_text(t)
                return {"token": s, "logprob": lp, "bytes": list(s.encode())}
            return {"content": [{**entry(x.token_id, x.logprob), "top_logprobs": [entry(t, lp) for t, lp in x.top]}
                                for x in lps]}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for x in lps:
            s = self.token_text(x.token_id)
            out["tokens"].append(s)
            out["token_logprobs"].append(x.logprob)
            out["top_logprobs"].append({self.token_text(t): lp for t, lp in x.top})
            out["text_offset"].append(self.offset)
            self.offset += len(s)
        return out

    def choice(self, text: str, finish: str | None, lps, token_ids: list[int], delta: bool, first: bool = False) -> dict:
        c: dict[str, Any] = {"index": 0}
        if self.chat:
            msg = {"role": "assistant", "content": text} if not delta or first else {"content": text}
            c["delta" if delta else "message"] = msg
        else:
            c["text"] = text
        c["logprobs"] = self.logprobs(lps)
        c["finish_reason"] = finish
        if self.token_ids:
            c["token_ids"] = token_ids
        return c

    def chunk(self, d: RequestDelta | None, first: bool = False) -> dict:
        obj = self._head("chat.completion.chunk" if self.chat else "text_completion")
        if d is None:
            obj["choices"] = [self.choice("", None, None, [], delta=True, first=True)]
        else:
            obj["choices"] = [self.choice(d.text or "", d.finish_reason, d.logprobs, d.token_ids, delta=True)]
        return obj

    def usage_chunk(self, d: RequestDelta) -> dict:
        obj = self._head("chat.completion.chunk" if self.chat else "text_completion")
        obj["choices"], obj["usage"] = [], _usage(d)
        return obj

    def whole(self, deltas: list[RequestDelta]) -> dict:
        obj = self._head("chat.completion" if self.chat else "text_completion")
        last = deltas[-1] if deltas else None
        lps = None if not deltas or deltas[0].logprobs is None else [x for d in deltas for x in d.logprobs or []]
        ids = [t for d in deltas for t in d.token_ids]
        obj["choices"] = [self.choice("".join(d.text or "" for d in deltas), last.finish_reason if last else "abort",
                                      lps, ids, delta=False)]
        obj["usage"] = _usage(last) if last else None
        return obj


def _usage(d: RequestDelta) -> dict:
    return {"prompt_tokens": d.num_prompt_tokens, "completion_tokens": d.num_output_tokens,
            "total_tokens": d.num_prompt_tokens + d.num_output_tokens}


def serve(llm: LLM, model_name: str, host: str = "127.0.0.1", port: int = 8000, max_queued: int | None = None,
          log_level: str = "info") -> None:
    """Run the server in this thread until interrupted."""
    import uvicorn

    uvicorn.run(build_app(llm, model_name, max_queued), host=host, port=port, log_level=log_level)
