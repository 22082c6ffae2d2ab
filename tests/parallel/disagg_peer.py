"""The producer process of the disaggregation tests: one link, then one prefill session per entry (the
consumer runs the same sessions in the test process), then it dies mid-session."""
from __future__ import annotations

import os

from hybridcache import LLM
from hybridcache.disagg import KVChannel, KVProducer, KVTransferConfig, TransferLayoutError


def producer_main(sessions: list[tuple[str, dict, list, object]], ports, timeout_s: float) -> None:
    """`sessions`: (checkpoint, LLM keyword arguments, prompts, sampling params). The link's port goes to
    the `ports` queue. A session whose layout the consumer refuses is skipped; after the last one the
    process handshakes once more and exits without sending anything (the consumer's dead peer)."""
    channel = KVChannel(KVTransferConfig("kv_producer", kv_port=0, kv_timeout_s=timeout_s), on_port=ports.put)
    for path, kwargs, prompts, params in sessions:
        llm = LLM(path, **kwargs)
        try:
            producer = KVProducer(llm, channel)
        except TransferLayoutError:
            continue
        producer.prefill(prompts, params)
        producer.close()
    KVProducer(LLM(sessions[-1][0], **sessions[-1][1]), channel)
    os._exit(3)
