"""`hybridcache serve --role prefill|decode`: the decode server is the front door (OpenAI API); it sends each
prompt to the prefill server (here the CLI in another process, gloo over the link), gets the prefilled
request back and decodes it. Completions, streamed or not, and one that ends at its first token (made at
the prefill server) equal the colocated engine's tokens; the decode side holds nothing afterwards."""
from __future__ import annotations

import multiprocessing as mp
import socket

import pytest

from hybridcache import LLM, SamplingParams
from hybridcache.cli import main
from hybridcache.disagg import KVTransferConfig
from hybridcache.disagg.remote import RemotePrefill
from tests.models.helpers import save_tiny
from tests.server.helpers import serve

pytest.importorskip("openai")
PROMPTS = [[5, 17, 3, 42, 8, 8, 13, 21], [9, 10, 11], [30, 31, 32, 30, 31]]
ARGS = ["--max-model-len", "64"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prefill_cli(path: str, port: int) -> None:
    raise SystemExit(main(["serve", path, "--role", "prefill", "--kv-port", str(port), *ARGS]))


def test_decode_front_door_with_a_prefill_server_equals_colocated(tmp_path):
    path = str(save_tiny(tmp_path)[0])
    want = [o.token_ids for o in LLM(path, max_model_len=64).generate(PROMPTS, SamplingParams(max_tokens=9,
                                                                                              ignore_eos=True))]
    port = free_port()
    proc = mp.get_context("spawn").Process(target=prefill_cli, args=(path, port), daemon=True)
    proc.start()
    try:
        llm = LLM(path, max_model_len=64)
        front = RemotePrefill(llm, KVTransferConfig("kv_consumer", kv_port=port, kv_timeout_s=30))
        with serve(front, "tiny") as srv:
            client = srv.openai()
            extra = {"ignore_eos": True, "return_token_ids": True}
            for ids, w in zip(PROMPTS, want):
                r = client.completions.create(model="tiny", prompt=ids, max_tokens=9, temperature=0, extra_body=extra)
                assert r.choices[0].token_ids == w and r.choices[0].finish_reason == "length"
                assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 9)
            streamed = []
            for chunk in client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=9, temperature=0,
                                                   stream=True, extra_body=extra):
                streamed += chunk.choices[0].token_ids
            assert streamed == want[0]
            r = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=1, temperature=0, extra_body=extra)
            assert r.choices[0].token_ids == want[1][:1] and r.choices[0].finish_reason == "length"
            srv.wait_idle()
            assert llm.stats.num_resumes == len(PROMPTS) + 1  # every request but the one that ended there
            llm.manager.check_integrity()
            assert llm.manager.requests() == []
        front.close()  # the prefill server's serve() returns: the CLI exits 0
        proc.join(timeout=30)
        assert proc.exitcode == 0
    finally:
        if proc.exitcode is None:
            proc.kill()
