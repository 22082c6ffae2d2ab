"""`KVProducer`: the prefill side of a pair. It prefills prompts and hands each one over once its prompt is in
the cache and its first token sampled; the request then leaves this engine."""
from __future__ import annotations

from typing import Sequence

from ..engine.llm import LLM
from ..engine.params import SamplingParams
from ..engine.prefilled import PrefilledRequest
from ..engine.request import RequestOutput
from .channel import KVChannel
from .config import KVTransferConfig
from .errors import TransferLayoutError
from .layout import cache_layout, resharder

REQUEST, FINISHED, END = "request", "finished", "end"


class KVProducer:
    """Sends over `channel` (or one made from a producer `KVTransferConfig`) to a `KVConsumer`, after a
    handshake that checks both caches lay a request out alike (TransferLayoutError on both sides).

    Messages, in order: `(REQUEST, meta)` then the slot record and the page records (uint8 tensors, in the
    unsharded layout whatever either side's tensor-parallel size);
    `(FINISHED, meta)` for a request that ended at its first token (no state); `(END,)` from `close()`."""

    def __init__(self, llm: LLM, link: KVChannel | KVTransferConfig) -> None:
        self.llm = llm
        self._owns_link = not isinstance(link, KVChannel)
        self.channel = KVChannel(link) if self._owns_link else link
        if not self.channel.config.is_producer:
            raise ValueError("a KVProducer needs a kv_producer link")
        self.reshard = resharder(llm)
        self.channel.send_object(cache_layout(llm, self.reshard))
        reply = self.channel.recv_object()
        if reply is not None:
            raise TransferLayoutError(reply)
        self.num_sent = 0
        self.bytes_sent = 0

    def prefill(self, prompts: Sequence[Sequence[int]] | Sequence[str],
                params: SamplingParams | Sequence[SamplingParams] | None = None) -> int:
        """Prefill every prompt (batched as the scheduler sees fit) and send each to the consumer as soon as
        its first token is sampled; returns how many were sent. All prompts are checked first (a bad one
        raises and nothing is queued); on any error the unsent ones are aborted and the error re-raised."""
        llm = self.llm
        plist = list(params) if isinstance(params, Sequence) else [params or llm.default_params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        ids = [llm.check_request(p, q) for p, q in zip(prompts, plist)]
        pending: dict[int, None] = {}
        try:
            for i, q in zip(ids, plist):
                pending[llm.add_request(i, q)] = None
            while pending:
                ended = {o.request_id: o for o in llm.step() if o.request_id in pending}  # at its first token
                for rid in list(pending):  # in arrival order: a batch prefilled together leaves in order
                    if rid in ended:
                        del pending[rid]
                        self._send_finished(ended[rid])
                    elif (ready := llm.take_prefilled(rid)) is not None:
                        del pending[rid]
                        self._send(ready)
        except BaseException:
            for rid in pending:
                llm.abort_request(rid)
            raise
        return len(ids)

    def _send(self, p: PrefilledRequest, tag: object = None) -> None:
        """The request in the unsharded layout: a tensor-parallel engine's ranks' shards joined by head."""
        shards = [(p.slot_record, p.page_records)]
        if self.reshard.size > 1:
            store = self.llm.manager.store
            shards += store.gathered  # the workers' shards, gathered by take_prefilled's export
            store.gathered = []
        slot, pages = self.reshard.join(shards)
        meta = {"prompt": p.prompt, "output": p.output, "params": p.params, "seed": p.seed, "logprobs": p.logprobs,
                "pages": int(pages.shape[0]), "tag": tag}
        self.channel.send_object((REQUEST, meta))
        self.channel.send(slot)
        self.channel.send(pages)
        self.num_sent += 1
        self.bytes_sent += slot.numel() + pages.numel()

    def _send_finished(self, out: RequestOutput, tag: object = None) -> None:
        self.channel.send_object((FINISHED, out, tag))
        self.num_sent += 1

    def close(self) -> None:
        """Tell the consumer nothing more comes; drop the link if this producer made it (a channel passed in
        stays open for the next pair)."""
        if self.channel.failure is None:
            self.channel.send_object((END,))
        if self._owns_link:
            self.channel.close()
