"""The OpenAI-compatible server, driven by the official `openai` client (raw HTTP for the error cases),
on a tiny checkpoint without a tokenizer (token ids) and on the embedded default (text and chat)."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from hybridcache import LLM, SamplingParams  # noqa: E402
from hybridcache.workload import make_prompts  # noqa: E402
from tests.models.helpers import save_tiny  # noqa: E402
from tests.server.helpers import HeldSteps, default_checkpoint, serve  # noqa: E402

IDS = [5, 17, 3, 42, 8, 8, 13, 21]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path, _ = save_tiny(tmp_path_factory.mktemp("tiny"))
    return path


@pytest.fixture(scope="module")
def default(tmp_path_factory):
    path = default_checkpoint(tmp_path_factory.mktemp("home"))
    ref = LLM(path)
    if ref.tokenizer is None or getattr(ref.tokenizer, "chat_template", None) is None:
        pytest.skip("the embedded default has no tokenizer with a chat template yet")
    return path, ref


def assert_idle_and_empty(llm: LLM) -> None:
    llm.manager.check_integrity()
    assert llm.manager.requests() == []
    planner = llm.manager.planner
    for pool in (planner.slot_pool, planner.page_pool, planner.host_slot_pool, planner.host_page_pool):
        assert pool.num_owned == 0


def metrics_of(text: str) -> dict[str, float]:
    """{sample name + sorted labels other than model_name: value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def test_token_id_prompts_equal_generate_and_text_is_refused_without_a_tokenizer(tiny):
    ref = LLM(tiny).generate([IDS], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    with serve(LLM(tiny), "tiny") as srv:
        client = srv.openai()
        assert [m.id for m in client.models.list().data] == ["tiny"]
        assert httpx.get(srv.base + "/health").json() == {"status": "ok"}
        r = client.completions.create(model="tiny", prompt=IDS, max_tokens=10, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
        choice = r.choices[0]
        assert choice.token_ids == ref.token_ids and choice.finish_reason == "length"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(IDS), 10)
        streamed = []
        for chunk in client.completions.create(model="tiny", prompt=IDS, max_tokens=10, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True, "return_token_ids": True}):
            streamed += chunk.choices[0].token_ids
        assert streamed == ref.token_ids
        for body, match in [({"prompt": "some text"}, "no tokenizer"),
                            ({"prompt": IDS, "stop": ["x"]}, "stop strings need a tokenizer")]:
            resp = httpx.post(srv.base + "/v1/completions", json={"model": "tiny", **body})
            assert resp.status_code == 400 and match in resp.json()["error"]["message"]
        resp = httpx.post(srv.base + "/v1/chat/completions",
                          json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 400 and "chat template" in resp.json()["error"]["message"]
        srv.wait_idle()
        assert_idle_and_empty(srv.llm)


def test_bad_requests_get_openai_errors_and_a_full_queue_503(tiny):
    llm = LLM(tiny)
    llm.step_hook = hold = HeldSteps()  # no step runs before the long request below
    with serve(llm, "tiny", max_queued=1) as srv:
        url = srv.base + "/v1/completions"
        cases = [
            ({"prompt": IDS, "n": 2}, "n"),
            ({"prompt": [1, 2, 9999]}, None),  # outside the vocabulary
            ({"prompt": IDS, "temperature": -1}, None),
            ({"prompt": IDS, "max_tokens": "5"}, "max_tokens"),
            ({"prompt": IDS, "max_tokens": 0}, None),
            ({"prompt": [1, "a"]}, "prompt"),
            ({"prompt": []}, None),
            ({"prompt": [IDS, IDS]}, "prompt"),
            ({}, "prompt"),
            ({"prompt": IDS, "logprobs": 99}, None),
        ]
        for body, param in cases:
            resp = httpx.post(url, json=body)
            assert resp.status_code == 400, (body, resp.text)
            err = resp.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
            assert err["code"] == 400 and err["message"], body
            if param is not None:
                assert err["param"] is not None and err["param"].startswith(param), (body, err)
        resp = httpx.post(url, json={"prompt": IDS, "model": "other"})
        assert resp.status_code == 404 and resp.json()["error"]["type"] == "model_not_found"
        assert resp.json()["error"]["param"] == "model"
        with httpx.Client(timeout=30) as http:
            long = {"prompt": IDS, "max_tokens": 20, "ignore_eos": True, "stream": True, "return_token_ids": True}
            # the response stays open and unread until released (a dropped `iter_lines()` generator would
            # close the connection, and the server would rightly abort the request and free its place)
            with http.stream("POST", url, json=long) as first:
                assert first.status_code == 200
                assert hold.held.wait(30)  # the core is held right after the long request's first step
                resp = http.post(url, json={"prompt": IDS, "max_tokens": 2})
                assert resp.status_code == 503 and srv.core.num_live == 1
                assert resp.json()["error"]["type"] == "service_unavailable"
                hold.release()
                events = [line for line in first.iter_lines() if line]
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(e.removeprefix("data: "))["choices"][0] for e in events[:-1]]
        assert sum(len(c["token_ids"]) for c in chunks) == 20 and chunks[-1]["finish_reason"] == "length"
        srv.wait_idle()
        assert_idle_and_empty(srv.llm)
        resp = httpx.post(url, json={"prompt": IDS, "max_tokens": 2})
        assert resp.status_code == 200


def test_text_chat_streaming_logprobs_and_stop_strings(default):
    path, ref = default
    tok = ref.tokenizer
    greedy = SamplingParams(max_tokens=12, ignore_eos=True)
    want = ref.generate(["Hello! How are"], greedy)[0]
    messages = [{"role": "user", "content": "Hello"}]
    chat_ids = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False)
    want_chat = ref.generate([chat_ids], greedy)[0]
    with serve(LLM(path), "default") as srv:
        client = srv.openai()
        extra = {"ignore_eos": True}
        r = client.completions.create(model="default", prompt="Hello! How are", max_tokens=12, temperature=0,
                                      logprobs=3, extra_body=extra)
        c = r.choices[0]
        assert c.text == want.text and c.finish_reason == "length"
        lp = c.logprobs
        assert len(lp.token_logprobs) == len(lp.top_logprobs) == 12
        lp_ref = ref.generate(["Hello! How are"], SamplingParams(max_tokens=12, ignore_eos=True, logprobs=3))[0].logprobs
        for x in lp_ref:  # greedy: the sampled token is the likeliest
            assert len(x.top) == 3 and (x.top[0][0], x.top[0][1]) == (x.token_id, x.logprob)
            assert x.top[0][1] >= x.top[1][1] >= x.top[2][1]
        assert lp.token_logprobs == pytest.approx([x.logprob for x in lp_ref], abs=1e-5)
        assert lp.tokens == [tok.decode([x.token_id]) for x in lp_ref]

        r = client.chat.completions.create(model="default", messages=messages, max_tokens=12, temperature=0,
                                           extra_body=extra)
        assert r.choices[0].message.content == want_chat.text and r.choices[0].message.role == "assistant"
        assert r.usage.prompt_tokens == len(chat_ids)
        chunks = list(client.chat.completions.create(model="default", messages=messages, max_tokens=12, temperature=0,
                                                     stream=True, stream_options={"include_usage": True},
                                                     logprobs=True, top_logprobs=2, extra_body=extra))
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
        assert chunks[-2].choices[0].finish_reason == "length"
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1]) == want_chat.text
        assert sum(len(ch.choices[0].logprobs.content) for ch in chunks[1:-1] if ch.choices[0].logprobs) == 12

        text = want.text  # a stop string from the middle of the greedy text: the text ends right before it
        at = next(i for i in range(3, len(text) - 2) if "\ufffd" not in text[: i + 2] and text[i:i + 2].strip())
        stop = text[at:at + 2]
        cut = text[: text.find(stop)]
        r = client.completions.create(model="default", prompt="Hello! How are", max_tokens=12, temperature=0,
                                      stop=[stop], extra_body=extra)
        assert (r.choices[0].text, r.choices[0].finish_reason) == (cut, "stop")
        streamed = "".join(ch.choices[0].text for ch in client.completions.create(
            model="default", prompt="Hello! How are", max_tokens=12, temperature=0, stop=stop, stream=True,
            extra_body=extra))
        assert streamed == cut
        srv.wait_idle()
        assert_idle_and_empty(srv.llm)


def test_32_concurrent_streams_equal_generate(default):
    path, ref = default
    prompts = make_prompts(32, ref.vocab_size, seed=1, min_len=4, max_len=24)
    params = [SamplingParams(max_tokens=6 + i % 7, temperature=0.8 if i % 2 else 0.0, top_k=20 * (i % 3),
                             seed=1000 + i, ignore_eos=i % 4 == 0) for i in range(32)]
    want = ref.generate(prompts, params)

    async def one(client, prompt, p):
        ids, text, finish = [], "", None
        stream = await client.completions.create(
            model="default", prompt=prompt, max_tokens=p.max_tokens, temperature=p.temperature, seed=p.seed,
            stream=True, extra_body={"top_k": p.top_k, "ignore_eos": p.ignore_eos, "return_token_ids": True})
        async for chunk in stream:
            ids += chunk.choices[0].token_ids
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return ids, text, finish

    async def all_of(srv):
        client = srv.async_openai()
        return await asyncio.wait_for(asyncio.gather(*(one(client, q, p) for q, p in zip(prompts, params))), 120)

    with serve(LLM(path, max_num_seqs=8), "default") as srv:
        got = asyncio.run(all_of(srv))
        srv.wait_idle()
        assert_idle_and_empty(srv.llm)
    for (ids, text, finish), w in zip(got, want):
        assert (ids, text, finish) == (w.token_ids, w.text, w.finish_reason)


def test_a_client_that_disconnects_mid_stream_is_aborted_and_metrics_count_the_run(default):
    path, ref = default
    llm = LLM(path)
    llm.step_hook = lambda: time.sleep(0.002)  # (on the core's thread) long requests stay running for seconds
    with serve(llm, "default") as srv:
        client = srv.openai()
        lengths = [(4, 5), (9, 7), (14, 3)]
        for n, m in lengths:
            r = client.completions.create(model="default", prompt=list(range(10, 10 + n)), max_tokens=m,
                                          temperature=0, extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == m
        with httpx.Client(timeout=30) as http:
            body = {"model": "default", "prompt": [7, 8, 9], "max_tokens": 2000, "ignore_eos": True, "stream": True}
            with http.stream("POST", srv.base + "/v1/completions", json=body) as resp:
                lines = resp.iter_lines()
                seen = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
                assert len(seen) >= 3
            with pytest.raises(httpx.ReadTimeout):  # a plain request whose client gives up: aborted too
                http.post(srv.base + "/v1/completions", json={**body, "stream": False}, timeout=0.3)
        srv.wait_idle()
        assert_idle_and_empty(srv.llm)
        m = metrics_of(httpx.get(srv.base + "/metrics").text)
        stats = srv.llm.stats
    assert m["hybridcache:request_success_total{finished_reason=length}"] == 3
    assert m["hybridcache:request_success_total{finished_reason=abort}"] == 2
    aborted_tokens = m["hybridcache:generation_tokens_total"] - sum(mt for _, mt in lengths)
    assert 3 <= aborted_tokens < 4000
    assert m["hybridcache:prompt_tokens_total"] == sum(n for n, _ in lengths) + 3 + 3
    assert m["hybridcache:time_to_first_token_seconds_count"] == 5
    assert m["hybridcache:e2e_request_latency_seconds_count"] == 5
    assert m["hybridcache:inter_token_latency_seconds_count"] >= sum(mt - 1 for _, mt in lengths)
    assert m["hybridcache:num_requests_running"] == m["hybridcache:num_requests_waiting"] == 0
    assert m["hybridcache:device_slots_used"] == m["hybridcache:device_pages_used"] == 0
    assert m["hybridcache:kv_cache_usage_perc"] == 0 and m["hybridcache:device_slots_total"] > 0
    assert m["hybridcache:num_steps_total"] == stats.num_steps > 0
    for name in ("num_suspensions", "num_resumes", "num_reprefills", "num_rebalances", "bytes_to_host",
                 "bytes_to_device"):
        assert m[f"hybridcache:{name}_total"] == getattr(stats, name)


def test_the_serve_command_answers_and_refuses_a_bad_model_dir_in_one_line(tiny, tmp_path):
    import os
    import socket
    import subprocess
    import sys
    import time

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    bad = subprocess.run([sys.executable, "-m", "hybridcache.cli", "serve", str(tmp_path / "missing")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "hybridcache.cli", "serve", str(tiny), "--port", str(port),
                             "--served-model-name", "t"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": "t", "prompt": IDS, "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bench_serve_against_our_server(default, endpoint):
    """`hybridcache bench serve`'s engine against this server: every request completes, the token counts are
    the requested ones, and the latencies are ordered."""
    from hybridcache.bench.serve import BenchConfig, run_benchmark

    path, _ = default
    llm = LLM(path, max_num_seqs=8)
    with serve(llm, "default") as srv:
        for kw in (dict(max_concurrency=4), dict(request_rate=50.0)):
            s = run_benchmark(BenchConfig(base_url=srv.base, endpoint=endpoint, num_prompts=8, input_len=16,
                                          output_len=8, ignore_eos=True, **kw))
            assert (s["completed"], s["failed"]) == (8, 0), s["errors"]
            assert s["total_output_tokens"] == 8 * 8
            assert 0 < s["median_ttft_ms"] <= s["p99_ttft_ms"] and s["median_ttft_ms"] <= s["median_e2el_ms"]
        srv.wait_idle()
        assert_idle_and_empty(llm)
