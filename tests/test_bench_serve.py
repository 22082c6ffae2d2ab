"""`bench serve` against a fake OpenAI-compatible server (FastAPI + uvicorn on an ephemeral port): tokens
counted from the usage chunk, timings consistent, the concurrency cap held, the JSON written."""
import asyncio
import json
import math
import random
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from hybridcache.bench.datasets import random_prompts, shared_prefix_prompts  # noqa: E402
from hybridcache.bench.serve import BenchConfig, main, run_benchmark  # noqa: E402

CHUNK_SLEEP_S = 0.002
MODEL = "fake-model"


class FakeServer:
    """Streams `max_tokens` chunks (one token each, `t{i}`) and a usage chunk; records what it saw."""

    def __init__(self) -> None:
        from fastapi import FastAPI, Request
        from fastapi.responses import StreamingResponse

        self.in_flight = self.max_in_flight = 0
        self.prompts: list = []
        self.bodies: list[dict] = []
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict:
            return {"object": "list", "data": [{"id": MODEL, "object": "model"}, {"id": "other", "object": "model"}]}

        async def stream(body: dict, chat: bool):
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                prompt = body["messages"][-1]["content"] if chat else body["prompt"]
                self.prompts.append(prompt)
                n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
                n = body["max_tokens"]
                if chat:  # a role-only first chunk, as OpenAI sends: no token
                    yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
                for i in range(n):
                    await asyncio.sleep(CHUNK_SLEEP_S)
                    choice = {"index": 0, "finish_reason": "length" if i == n - 1 else None}
                    choice.update({"delta": {"content": f"t{i} "}} if chat else {"text": f"t{i} "})
                    yield f"data: {json.dumps({'model': body['model'], 'choices': [choice]})}\n\n"
                usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                self.in_flight -= 1

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.bodies.append(body)
            return StreamingResponse(stream(body, chat=False), media_type="text/event-stream")

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.bodies.append(body)
            return StreamingResponse(stream(body, chat=True), media_type="text/event-stream")

        self.app = app


@pytest.fixture(scope="module")
def server():
    import uvicorn

    fake = FakeServer()
    uv = uvicorn.Server(uvicorn.Config(fake.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "fake server did not start"
        time.sleep(0.01)
    port = uv.servers[0].sockets[0].getsockname()[1]
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    uv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def fake(server):
    server.prompts.clear()
    server.bodies.clear()
    server.max_in_flight = 0
    return server


def check_consistent(summary: dict, num: int, output_len: int) -> None:
    assert summary["completed"] == num and summary["failed"] == 0, summary["errors"]
    assert summary["total_output_tokens"] == num * output_len
    assert summary["output_throughput"] == pytest.approx(num * output_len / summary["duration_s"])
    assert summary["request_throughput"] == pytest.approx(num / summary["duration_s"])
    for r in summary["per_request"]:
        assert r["output_tokens"] == output_len and len(r["itl"]) == output_len - 1
        assert 0 < r["ttft"] < r["e2el"] <= summary["duration_s"]
        assert r["ttft"] + sum(r["itl"]) <= r["e2el"]
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < summary[f"median_{name}_ms"] <= summary[f"p99_{name}_ms"]
        assert summary[f"mean_{name}_ms"] <= summary[f"p99_{name}_ms"]
    assert summary["p99_ttft_ms"] < summary["p99_e2el_ms"] and summary["mean_ttft_ms"] < summary["mean_e2el_ms"]
    assert summary["mean_itl_ms"] >= CHUNK_SLEEP_S * 1000 * 0.9  # gaps are at least the server's sleeps


def test_fixed_concurrency_holds_the_cap(fake):
    summary = run_benchmark(BenchConfig(base_url=fake.url, num_prompts=8, max_concurrency=4, input_len=16,
                                        output_len=6))
    check_consistent(summary, 8, 6)
    assert fake.max_in_flight == 4
    assert summary["model"] == MODEL and all(b["model"] == MODEL for b in fake.bodies)
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} for b in fake.bodies)
    assert summary["total_input_tokens"] == 8 * 16
    assert sorted(map(tuple, fake.prompts)) == sorted(map(tuple, random_prompts(8, 16, seed=0, text=False,
                                                                                  low=3, high=512)))


def test_poisson_rate_spreads_arrivals(fake):
    rate = 200.0
    summary = run_benchmark(BenchConfig(base_url=fake.url + "/v1/", model="named", num_prompts=8,
                                        request_rate=rate, output_len=4, input_len=8, seed=3))
    check_consistent(summary, 8, 4)
    assert all(b["model"] == "named" for b in fake.bodies)
    assert summary["config"]["request_rate"] == rate
    rng = random.Random(3)  # the generator's own draws: the last request cannot be sent before their sum
    assert summary["duration_s"] >= sum(rng.expovariate(rate) for _ in range(7))


def test_chat_shared_prefix_skips_the_role_chunk_and_writes_json(fake, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--base-url", fake.url, "--endpoint", "chat", "--dataset", "shared-prefix", "--num-prompts", "6",
            "--prefix-len", "10", "--num-prefixes", "2", "--input-len", "3", "--output-len", "5",
            "--max-concurrency", "3", "--json", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "Successful requests:" in table and "P99 ITL (ms):" in table
    summary = json.loads(out.read_text())
    check_consistent(summary, 6, 5)
    assert summary["config"]["request_rate"] == "inf" and fake.max_in_flight <= 3
    assert summary["total_input_tokens"] == 6 * 13
    prefixes = {" ".join(p.split()[:10]) for p in fake.prompts}
    assert len(prefixes) == 2


def test_shared_prefix_prompts_share_exactly_their_prefix():
    prompts = shared_prefix_prompts(6, 5, 3, 4, seed=1, text=False, low=3, high=512)
    assert [len(p) for p in prompts] == [9] * 6
    assert all(prompts[i][:5] == prompts[i + 3][:5] for i in range(3))
    assert len({tuple(p[:5]) for p in prompts}) == 3 and len({tuple(p[5:]) for p in prompts}) == 6
    assert all(3 <= t < 512 for p in prompts for t in p)
    assert prompts == shared_prefix_prompts(6, 5, 3, 4, seed=1, text=False, low=3, high=512)


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["--base-url", "http://127.0.0.1:9", "--model", "m", "--num-prompts", "2"]) == 1
    assert "ConnectError" in capsys.readouterr().err
    assert main(["--base-url", "http://127.0.0.1:9", "--num-prompts", "0"]) == 2
    assert main(["--base-url", "http://127.0.0.1:9", "--request-rate", "0"]) == 2
    assert math.isinf(BenchConfig().request_rate)


def test_cli_subcommand(fake, capsys):
    from hybridcache.cli import main as cli_main

    assert cli_main(["bench", "serve", "--base-url", fake.url, "--num-prompts", "3", "--input-len", "4",
                     "--output-len", "2", "--max-concurrency", "2"]) == 0
    rows = {line.rsplit(None, 1)[0]: line.rsplit(None, 1)[1] for line in capsys.readouterr().out.splitlines()
            if line.strip() and not set(line) <= set("=- ") and line[0] not in "=-"}
    assert rows["Successful requests:"] == "3" and rows["Total generated tokens:"] == "6"
    assert rows["Failed requests:"] == "0" and float(rows["Median TTFT (ms):"]) > 0
    assert fake.max_in_flight <= 2
