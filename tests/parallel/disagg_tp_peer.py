"""The peer process of tests/parallel/test_disagg_tp.py: a tensor-parallel-size-1 engine per checkpoint that
first prefills for the test process's size-2 engine, then decodes what that engine prefills."""
from __future__ import annotations

from hybridcache import LLM
from hybridcache.disagg import KVChannel, KVConsumer, KVProducer, KVTransferConfig


def peer_main(sessions: list[tuple[str, dict, list, list]], to_test, from_test, timeout_s: float) -> None:
    """`sessions`: (checkpoint, LLM keyword arguments, prompts, sampling params). Link A (this side
    produces) gets its port to `to_test`; link B's port (this side consumes) comes from `from_test`. Each
    session's decoded token ids go to `to_test`."""
    a = KVChannel(KVTransferConfig("kv_producer", kv_port=0, kv_timeout_s=timeout_s), on_port=to_test.put)
    b = KVChannel(KVTransferConfig("kv_consumer", kv_port=from_test.get(timeout=timeout_s), kv_timeout_s=timeout_s))
    for path, kwargs, prompts, params in sessions:
        llm = LLM(path, **kwargs)
        producer = KVProducer(llm, a)
        producer.prefill(prompts, params)
        producer.close()
        to_test.put([o.token_ids for o in KVConsumer(llm, b).generate()])
    a.close()
    b.close()
