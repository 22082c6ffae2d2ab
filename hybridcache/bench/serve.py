"""`bench serve`: a load generator for any OpenAI-compatible endpoint, after `vllm bench serve`.

Requests arrive as a Poisson process at `request_rate` per second (inf: all at once), at most
`max_concurrency` in flight; each streams (`stream_options.include_usage`), so TTFT and ITL come from
chunk arrival times and the output token count from the usage chunk.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .datasets import Prompt, random_prompts, shared_prefix_prompts
from .metrics import RequestResult, format_table, summarize

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class BenchConfig:
    base_url: str = "http://127.0.0.1:8000"
    model: str | None = None                 # None: the first of GET /v1/models
    endpoint: str = "completions"            # or "chat" (text prompts)
    request_rate: float = math.inf           # Poisson arrivals per second; inf: all at once
    max_concurrency: int | None = None       # None: no limit
    num_prompts: int = 100
    dataset: str = "random"                  # or "shared-prefix"
    input_len: int = 128                     # shared-prefix: the suffix after the prefix
    output_len: int = 64
    prefix_len: int = 256
    num_prefixes: int = 4
    vocab_size: int = 512                    # token-id prompts draw from [first_token_id, vocab_size)
    first_token_id: int = 3                  # skip the embedded default's <pad>, <s>, </s>
    ignore_eos: bool = False                 # send vLLM's `ignore_eos` (not part of the OpenAI API)
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 600.0
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {sorted(ENDPOINTS)}, got {self.endpoint!r}")
        if self.dataset not in ("random", "shared-prefix"):
            raise ValueError(f"dataset must be 'random' or 'shared-prefix', got {self.dataset!r}")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (inf: all at once), got {self.request_rate}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        for name in ("num_prompts", "output_len", "num_prefixes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.input_len < 0 or self.prefix_len < 0:
            raise ValueError("input_len and prefix_len must be >= 0")
        if not 0 <= self.first_token_id < self.vocab_size:
            raise ValueError(f"need 0 <= first_token_id < vocab_size, got {self.first_token_id}, {self.vocab_size}")
        self.base_url = self.base_url.rstrip("/").removesuffix("/v1")


def make_prompts(config: BenchConfig) -> list[Prompt]:
    text = config.endpoint == "chat"
    common = dict(seed=config.seed, text=text, low=config.first_token_id, high=config.vocab_size)
    if config.dataset == "random":
        return random_prompts(config.num_prompts, config.input_len, **common)
    return shared_prefix_prompts(config.num_prompts, config.prefix_len, config.num_prefixes, config.input_len,
                                 **common)


def request_body(config: BenchConfig, model: str, prompt: Prompt) -> dict:
    body: dict[str, Any] = dict(model=model, max_tokens=config.output_len, temperature=config.temperature,
                                stream=True, stream_options={"include_usage": True})
    if config.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if config.ignore_eos:
        body["ignore_eos"] = True
    return body


def _chunk_content(chunk: dict, chat: bool) -> str | None:
    """The content of a chunk's first choice; None when it carries no token (role-only, finish-only)."""
    choice = chunk["choices"][0]
    content = choice.get("delta", {}).get("content") if chat else choice.get("text")
    if content is None or (content == "" and choice.get("finish_reason") is not None):
        return None
    return content


async def stream_request(client: Any, config: BenchConfig, model: str, prompt: Prompt) -> RequestResult:
    """Send one streaming request and time its chunks (SSE lines `data: {...}`, ending `data: [DONE]`)."""
    result = RequestResult()
    chat = config.endpoint == "chat"
    start = last = time.perf_counter()
    usage: dict | None = None
    chunks = 0
    try:
        async with client.stream("POST", ENDPOINTS[config.endpoint],
                                 json=request_body(config, model, prompt)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {body[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, `: comments`, `event:` lines
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if not chunk.get("choices") or (content := _chunk_content(chunk, chat)) is None:
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                chunks += 1
                result.text += content
    except Exception as exc:  # a load generator reports failures, it does not stop on them
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.e2el = time.perf_counter() - start
    result.output_tokens = int(usage["completion_tokens"]) if usage else chunks
    result.prompt_tokens = int(usage["prompt_tokens"]) if usage else (len(prompt) if isinstance(prompt, list) else 0)
    result.success = chunks > 0
    if not result.success:
        result.error = "no content chunks in the stream"
    return result


async def _first_model(client: Any) -> str:
    response = await client.get("/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def _run(config: BenchConfig) -> dict:
    import httpx

    prompts = make_prompts(config)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    limits = httpx.Limits(max_connections=config.max_concurrency or config.num_prompts, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=config.base_url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(config.timeout_s)) as client:
        model = config.model or await _first_model(client)
        gate = asyncio.Semaphore(config.max_concurrency or len(prompts))
        rng = random.Random(config.seed)

        async def one(prompt: Prompt) -> RequestResult:
            async with gate:
                return await stream_request(client, config, model, prompt)

        start = time.perf_counter()
        tasks = []
        for i, prompt in enumerate(prompts):
            if i and math.isfinite(config.request_rate):
                await asyncio.sleep(rng.expovariate(config.request_rate))
            tasks.append(asyncio.create_task(one(prompt)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    summary = summarize(list(results), duration)
    summary.update(model=model, config={k: v if not isinstance(v, float) or math.isfinite(v) else str(v)
                                        for k, v in asdict(config).items() if k != "api_key"})
    summary["per_request"] = [dict(ttft=r.ttft, e2el=r.e2el, output_tokens=r.output_tokens,
                                   prompt_tokens=r.prompt_tokens, itl=r.itl, error=r.error) for r in results]
    return summary


def run_benchmark(config: BenchConfig) -> dict:
    """Run the benchmark; the summary of `metrics.summarize` plus `model`, `config` and `per_request`."""
    return asyncio.run(_run(config))


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The flags (on `parser` when given, e.g. a `bench serve` subparser)."""
    p = parser or argparse.ArgumentParser(prog="hybridcache bench serve", description=__doc__,
                                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = BenchConfig()
    p.add_argument("--base-url", default=d.base_url, help="server root (a trailing /v1 is dropped)")
    p.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    p.add_argument("--endpoint", choices=sorted(ENDPOINTS), default=d.endpoint,
                   help="/v1/completions (token-id prompts) or /v1/chat/completions (word prompts)")
    p.add_argument("--request-rate", type=float, default=d.request_rate,
                   help="Poisson arrivals per second (inf: all at once)")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: no limit)")
    p.add_argument("--num-prompts", type=int, default=d.num_prompts, help="requests sent in all")
    p.add_argument("--dataset", choices=("random", "shared-prefix"), default=d.dataset,
                   help="random prompts, or num-prefixes shared prefixes each followed by a random suffix")
    p.add_argument("--input-len", type=int, default=d.input_len,
                   help="prompt tokens (shared-prefix: tokens after the prefix); words for chat")
    p.add_argument("--output-len", type=int, default=d.output_len, help="max_tokens of each request")
    p.add_argument("--prefix-len", type=int, default=d.prefix_len, help="shared-prefix: tokens in each prefix")
    p.add_argument("--num-prefixes", type=int, default=d.num_prefixes, help="shared-prefix: distinct prefixes")
    p.add_argument("--vocab-size", type=int, default=d.vocab_size, help="random token ids lie below this")
    p.add_argument("--ignore-eos", action="store_true", help="send vLLM's ignore_eos so every request runs to --output-len")
    p.add_argument("--temperature", type=float, default=d.temperature, help="sent with every request")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the prompts and the arrival times")
    p.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds per request")
    p.add_argument("--api-key", default=None, help="sent as a Bearer token")
    p.add_argument("--json", dest="json_path", default=None, help="also write the results as JSON here")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(base_url=args.base_url, model=args.model, endpoint=args.endpoint,
                       request_rate=args.request_rate, max_concurrency=args.max_concurrency,
                       num_prompts=args.num_prompts, dataset=args.dataset, input_len=args.input_len,
                       output_len=args.output_len, prefix_len=args.prefix_len, num_prefixes=args.num_prefixes,
                       vocab_size=args.vocab_size, ignore_eos=args.ignore_eos, temperature=args.temperature,
                       seed=args.seed, timeout_s=args.timeout, api_key=args.api_key)


def run_from_args(args: argparse.Namespace) -> int:
    """Run, print the table, write --json; 0 when every request succeeded, 1 otherwise, 2 on bad flags."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = run_benchmark(config)
    except Exception as exc:  # e.g. nothing listening at --base-url
        print(f"error: {config.base_url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(format_table(summary))
    for error in summary["errors"]:
        print(f"error: {error}", file=sys.stderr)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["failed"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
