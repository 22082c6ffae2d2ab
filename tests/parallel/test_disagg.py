"""Disaggregated prefill/decode (`hybridcache.disagg`, gloo point-to-point between two processes): for every
family, the consumer's greedy tokens equal one colocated LLM's, plain and with n-gram speculation on the
decode side, while the consumer's scheduler resumes the handed-over requests under a seat limit; a request
that ends at its first token comes through too; caches laid out differently are refused on both sides;
a producer that dies reaches the consumer as KVTransferError within the timeout."""
from __future__ import annotations

import multiprocessing as mp
import random
import time

import pytest

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.disagg import KVChannel, KVConsumer, KVTransferConfig, KVTransferError, TransferLayoutError
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen
from tests.parallel.disagg_peer import producer_main

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny}
BASE = {"max_model_len": 64, "page_size": 4}
SPEC = {**BASE, "speculative": SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=2)}
TIMEOUT_S = 20.0


def _prompts_and_params() -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(1)
    # repeated motifs so that n-gram drafts get accepted
    prompts = [[rng.randrange(3, 96) for _ in range(rng.randint(3, 8))] * rng.randint(1, 3) for _ in range(6)]
    params = [SamplingParams(max_tokens=1 if i == 2 else 12, ignore_eos=True) for i in range(len(prompts))]
    return prompts, params


def test_config_is_validated():
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig("prefill")
    with pytest.raises(ValueError, match="needs the producer's kv_port"):
        KVTransferConfig("kv_consumer", kv_port=0)


def test_disaggregated_equals_colocated_and_a_dead_producer_raises(tmp_path_factory):
    prompts, params = _prompts_and_params()
    paths = {f: str(save(tmp_path_factory.mktemp(f))[0]) for f, save in SAVERS.items()}
    sessions = [(paths[f], kw, prompts, params) for f in sorted(paths) for kw in (BASE, SPEC)]
    sessions.append((paths["nemotron_h"], BASE, prompts, params))  # the consumer uses SPEC: refused
    wants = [[o.token_ids for o in LLM(path, **kw).generate(prompts, params)] for path, kw, _, _ in sessions[:-1]]
    ctx = mp.get_context("spawn")
    ports = ctx.Queue()
    proc = ctx.Process(target=producer_main, args=(sessions, ports, TIMEOUT_S), daemon=True)
    proc.start()
    try:
        channel = KVChannel(KVTransferConfig("kv_consumer", kv_port=ports.get(timeout=120), kv_timeout_s=TIMEOUT_S))
        for (path, kw, _, _), want in zip(sessions[:-1], wants):
            llm = LLM(path, max_num_seqs=3, **kw)  # fewer seats than requests: some wait suspended
            llm.step_hook = llm.manager.check_integrity
            consumer = KVConsumer(llm, channel)
            outs = consumer.generate()
            assert [o.token_ids for o in outs] == want, (path, kw)
            assert [o.finish_reason for o in outs] == ["length"] * len(prompts)
            assert llm.stats.num_resumes == len(prompts) - 1  # all but the one that ended at the producer
            if "speculative" in kw:
                assert llm.stats.num_accepted_tokens > 0
            assert llm.manager.requests() == [] and llm.manager.host_tier is not None
            llm.manager.check_integrity()
        with pytest.raises(TransferLayoutError, match="slot_roles differ"):
            KVConsumer(LLM(paths["nemotron_h"], **SPEC), channel)
        llm = LLM(paths["nemotron_h"], **BASE)
        consumer = KVConsumer(llm, channel)  # the producer exits right after this handshake
        start = time.monotonic()
        with pytest.raises(KVTransferError, match="the peer died"):
            consumer.generate()
        assert time.monotonic() - start < TIMEOUT_S
        with pytest.raises(KVTransferError):  # the link is unusable afterwards, at once
            channel.recv_object()
    finally:
        proc.join(timeout=30)
        if proc.exitcode is None:
            proc.kill()
    assert proc.exitcode == 3
