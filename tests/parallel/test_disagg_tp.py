"""Disaggregation between different tensor-parallel sizes: a request's records are joined by head into the
unsharded layout on the way out and sliced into the receiving engine's shards on the way in. For every
family (Mamba2 conv x/B/C + GQA pages; GDN conv q/k/v + gated GQA pages; KDA + replicated MLA latent
pages), with the replay roles of n-gram speculation: TP 1 -> 2 and 2 -> 1 give the colocated greedy tokens;
records split and joined again are the same bytes."""
from __future__ import annotations

import multiprocessing as mp
import random

import pytest
import torch

from hybridcache import LLM, SamplingParams, SpeculativeConfig
from hybridcache.disagg import KVChannel, KVConsumer, KVProducer, KVTransferConfig
from hybridcache.disagg.reshard import Resharder, ShardLayout, unsharded
from hybridcache.models.loader import model_on_meta
from hybridcache.parallel import TPGroup
from tests.models import helpers as nemotron
from tests.models import test_kimi_linear as kimi
from tests.models import test_qwen3_next as qwen
from tests.parallel.disagg_tp_peer import peer_main

SAVERS = {"nemotron_h": nemotron.save_tiny, "qwen3_next": qwen.save_tiny, "kimi_linear": kimi.save_tiny}
SPEC = {"max_model_len": 64, "page_size": 4, "speculative": SpeculativeConfig(backoff_max_steps=0, num_draft_tokens=2)}
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """(checkpoint, prompts, params, colocated greedy tokens) per family."""
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 96) for _ in range(rng.randint(3, 8))] * rng.randint(1, 3) for _ in range(4)]
    params = [SamplingParams(max_tokens=10, ignore_eos=True)] * len(prompts)
    out = []
    for f, save in sorted(SAVERS.items()):
        path = str(save(tmp_path_factory.mktemp(f))[0])
        out.append((path, prompts, params, [o.token_ids for o in LLM(path, **SPEC).generate(prompts, params)]))
    return out


def test_split_then_join_gives_the_same_bytes(families):
    for path, prompts, params, _ in families:
        llm = LLM(path, **SPEC)
        rid = llm.add_request(prompts[0], params[0])
        llm.step()
        p = llm.take_prefilled(rid)
        for size in (2, 4):
            try:
                shard = model_on_meta(path, tp=TPGroup(0, size))
            except ValueError:
                continue  # that size does not split this model
            r = Resharder(ShardLayout.of(unsharded(shard), 2, 4), ShardLayout.of(shard, 2, 4), size)
            shards = r.split((p.slot_record, p.page_records))
            assert len(shards) == size and shards[0][0].numel() < p.slot_record.numel()
            slot, pages = r.join(shards)
            assert torch.equal(slot, p.slot_record) and torch.equal(pages, p.page_records), (path, size)


def test_tensor_parallel_1_to_2_and_2_to_1_equal_colocated(families):
    ctx = mp.get_context("spawn")
    to_test, from_test = ctx.Queue(), ctx.Queue()
    sessions = [(path, SPEC, prompts, params) for path, prompts, params, _ in families]
    peer = ctx.Process(target=peer_main, args=(sessions, to_test, from_test, TIMEOUT_S))
    peer.start()
    try:
        a = KVChannel(KVTransferConfig("kv_consumer", kv_port=to_test.get(timeout=120), kv_timeout_s=TIMEOUT_S))
        b = KVChannel(KVTransferConfig("kv_producer", kv_port=0, kv_timeout_s=TIMEOUT_S), on_port=from_test.put)
        for path, prompts, params, want in families:
            llm = LLM(path, max_num_seqs=3, tensor_parallel_size=2, parallel_timeout_s=TIMEOUT_S, **SPEC)
            try:
                llm.step_hook = llm.manager.check_integrity
                got = [o.token_ids for o in KVConsumer(llm, a).generate()]  # 1 -> 2
                assert got == want, ("1 -> 2", path)
                assert llm.stats.num_resumes == len(prompts) and llm.stats.num_accepted_tokens > 0
                producer = KVProducer(llm, b)  # 2 -> 1
                producer.prefill(prompts, params)
                producer.close()
                assert to_test.get(timeout=TIMEOUT_S) == want, ("2 -> 1", path)
                assert llm.manager.requests() == []
                llm.manager.check_integrity()
            finally:
                llm.close()
    finally:
        peer.join(timeout=30)
        if peer.exitcode is None:
            peer.kill()
    assert peer.exitcode == 0
