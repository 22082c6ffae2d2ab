"""`LLM`: the public facade — load a checkpoint, build the cache, run requests to completion."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..cache import CacheConfig, HybridCacheManager, sizing_of
from ..models.checkpoint import read_config
from ..models.loader import load_model, load_tokenizer
from .drafter import NgramDrafter
from .errors import InvalidRequestError, RequestTooLargeError
from .params import SamplingParams, SpeculativeConfig
from .request import Phase, Request, RequestOutput
from .runner import ModelRunner
from .sampler import choose
from .scheduler import ScheduledStep, Scheduler

DEFAULT_TOKENS_PER_SEQ = 4096
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Stats:
    num_suspensions: int = 0
    num_resumes: int = 0
    num_reprefills: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    bytes_to_host: int = 0
    bytes_to_device: int = 0
    num_steps: int = 0
    num_generated_tokens: int = 0


class LLM:
    """Serve a hybrid checkpoint directory (config.json + *.safetensors) with continuous batching.

    `device_cache_bytes` is split between recurrent slots (`num_slots`; by default up to `max_num_seqs`
    within half the budget) and attention pages; `host_cache_bytes` is the host tier that suspended
    requests move to (by default as large as the device budget). `scheduling_policy`: "max_utilization"
    (admit while there is room now, suspend on growth) or "reserve" (admit only with room for the whole
    length, never suspend on growth).
    """

    def __init__(
        self,
        model: str | Path,
        device: str = "cpu",
        dtype: str = "float32",
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 512,
        device_cache_bytes: int | None = None,
        host_cache_bytes: int | None = None,
        page_size: int = 16,
        speculative: SpeculativeConfig | None = None,
        max_model_len: int | None = None,
        num_slots: int | None = None,
        scheduling_policy: str = "max_utilization",
        seed: int = 0,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.device = torch.device(device)
        self.model = load_model(model, device=self.device, dtype=DTYPES[dtype])
        self.tokenizer = load_tokenizer(model)
        cfg = read_config(model)
        self.vocab_size = int(cfg["vocab_size"])
        self.eos_token_id = _first(cfg.get("eos_token_id"))
        self.max_model_len = max_model_len or int(cfg.get("max_position_embeddings") or cfg.get("model_max_length") or 4096)
        self.speculative = speculative
        k = speculative.num_draft_tokens if speculative else 0
        self.generation_tokens = k + 1
        self.drafter = NgramDrafter(speculative) if speculative else None
        states = self.model.state_modules(k)
        pages = self.model.page_roles(page_size)
        sizing = sizing_of(states, pages)
        if device_cache_bytes is None:
            # every sequence at full length, but never more than DEFAULT_TOKENS_PER_SEQ tokens each (long-context
            # configs would otherwise ask for terabytes); pass the budget explicitly for anything else
            tokens = min(self.max_model_len, DEFAULT_TOKENS_PER_SEQ) + k
            device_cache_bytes = max_num_seqs * sizing.request_bytes(tokens, page_size)
        if num_slots is None:
            num_slots = min(max_num_seqs, max(1, device_cache_bytes // 2 // max(sizing.bytes_per_slot, 1)))
        self.sizing = sizing
        if host_cache_bytes is None:
            host_cache_bytes = device_cache_bytes
        self.manager = HybridCacheManager(
            states, pages,
            CacheConfig(device_bytes=device_cache_bytes, host_bytes=host_cache_bytes, page_size=page_size,
                        num_slots=num_slots, num_dummy_slots=0, device=str(self.device)),
        )
        self.scheduler = Scheduler(self.manager, max_num_seqs, max_num_batched_tokens, self.generation_tokens,
                                   scheduling_policy)
        self.runner = ModelRunner(self.model, self.manager, self.device, speculative is not None)
        self.seed = seed
        self._requests: dict[int, Request] = {}
        self._next_id = 0
        self._stats = Stats()
        self.step_hook: Callable[[], None] | None = None  # tests call check_integrity() here

    # ---------------------------------------------------------------------------------- public
    @property
    def stats(self) -> Stats:
        s, m = self._stats, self.manager.stats
        s.num_suspensions, s.num_resumes, s.num_reprefills = m["suspensions"], m["resumes"], m["reprefills"]
        s.bytes_to_host, s.bytes_to_device = m["bytes_to_host"], m["bytes_to_device"]
        return s

    def rebalance(self, num_slots: int) -> int:
        """Change the device split between recurrent slots and attention pages while requests are live;
        requests that no longer fit are suspended (or re-prefilled), the rest move with every role."""
        return self.scheduler.rebalance(num_slots)

    def device_bytes_needed(self, num_tokens: int) -> int:
        """Device bytes one request of `num_tokens` tokens holds: its pages and its slot, every role."""
        return self.manager.device_bytes_needed(num_tokens)

    def generate(
        self,
        prompts: Sequence[Sequence[int]] | Sequence[str],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order. All prompts are checked
        before any runs: a bad one raises and nothing is queued."""
        params = sampling_params or SamplingParams()
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        encoded = [self._encode(p) for p in prompts]
        for ids, p in zip(encoded, plist):
            self._validate(ids, p)
        rids = [self.add_request(ids, p) for ids, p in zip(encoded, plist)]
        done: dict[int, RequestOutput] = {}
        while len(done) < len(rids):
            for out in self.step():
                done[out.request_id] = out
            if progress:
                progress(len(done), len(rids))
        return [done[r] for r in rids]

    def add_request(self, prompt: Sequence[int] | str, params: SamplingParams | None = None) -> int:
        """Queue one request; raises InvalidRequestError (queueing nothing) on bad input."""
        params = params or SamplingParams()
        ids = self._encode(prompt)
        self._validate(ids, params)
        rid = self._next_id
        self._next_id += 1
        gen = None
        if not params.greedy:
            gen = torch.Generator().manual_seed(params.seed if params.seed is not None else self.seed * 1_000_003 + rid)
        req = Request(rid, ids, params, self.eos_token_id, arrival=rid, generator=gen)
        self._requests[rid] = req
        self.scheduler.add(req)
        return rid

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[RequestOutput]:
        """One scheduler step and one forward; returns the requests that finished in it."""
        step = self.scheduler.schedule()
        if step.empty:
            return []
        drafts = self._draft(step)
        longest = max(map(len, drafts.values()), default=0)
        fed = {rid: NgramDrafter.pad(d, self._requests[rid].tokens[-1], longest) for rid, d in drafts.items()}
        logits = self.runner.run(step, fed, 1 + longest)
        finished = self._commit(step, drafts, logits)
        self._stats.num_steps += 1
        if self.step_hook:
            self.step_hook()
        return finished

    # ---------------------------------------------------------------------------------- internals
    def _encode(self, prompt: Sequence[int] | str) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError("this checkpoint has no tokenizer: pass token ids, not text")
            return list(self.tokenizer.encode(prompt))
        return [int(t) for t in prompt]

    def _validate(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise InvalidRequestError("empty prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        total = len(ids) + params.max_tokens
        if total > self.max_model_len:
            raise InvalidRequestError(
                f"prompt ({len(ids)}) + max_tokens ({params.max_tokens}) = {total} exceeds max_model_len {self.max_model_len}"
            )
        need_pages = -(-(total + self.generation_tokens) // self.manager.page_size)
        if self.manager.page_roles and need_pages > self.manager.num_pages:
            raise RequestTooLargeError(
                f"a request of {total} tokens needs {self.device_bytes_needed(total + self.generation_tokens)} device "
                f"bytes ({need_pages} pages); the device cache holds {self.manager.num_pages} pages"
            )

    def _draft(self, step: ScheduledStep) -> dict[int, list[int]]:
        """Each generation row's proposal. The runner pads them to the step's longest (one verify shape);
        only a row's own drafts are judged, so its tokens and random draws never depend on its batch."""
        if self.drafter is None:
            return {}
        return {r.req_id: self.drafter.propose(r.tokens) for r in step.generation}

    def _commit(self, step: ScheduledStep, drafts: dict[int, list[int]], logits) -> list[RequestOutput]:
        """Choose tokens, record acceptance in the cache, advance the requests; returns the finished."""
        new_tokens, accepted = self._sample(step, drafts, logits)
        self.manager.accept(accepted)
        for req, chunk in step.context:
            req.num_prefilled += chunk
            if req.num_prefilled == req.context_len:
                self.manager.start_generation(req.req_id)
                req.phase = Phase.DECODE
        for req in step.generation:
            req.num_prefilled += len(new_tokens[req.req_id])  # the fed token and the accepted drafts
        finished = []
        for req in [r for r, _ in step.context] + step.generation:
            toks = new_tokens.get(req.req_id)
            if toks is None:
                continue
            before = len(req.output)
            if req.append(toks):
                self.scheduler.finish(req)
                finished.append(RequestOutput(req.req_id, req.prompt, list(req.output), self._decode(req.output)))
            self._stats.num_generated_tokens += len(req.output) - before
        return finished

    def _sample(self, step: ScheduledStep, drafts: dict[int, list[int]], logits) -> tuple[dict[int, list[int]], list[int]]:
        """New tokens per request, and per row the tokens now valid in the cache (context rows: the chunk;
        generation rows: the fed token plus the accepted drafts)."""
        new_tokens: dict[int, list[int]] = {}
        accepted: list[int] = []
        for (req, chunk), lg in zip(step.context, logits.context):
            accepted.append(chunk)
            if lg is not None:  # the prompt is done: its last position gives the first token
                new_tokens[req.req_id] = choose(lg[None], [], req.params, req.generator)
        for req, lg in zip(step.generation, logits.generation):
            d = drafts.get(req.req_id, [])
            out = choose(lg[: len(d) + 1], d, req.params, req.generator)
            accepted.append(len(out))
            new_tokens[req.req_id] = out
            self._stats.num_draft_tokens += len(d)
            self._stats.num_accepted_tokens += len(out) - 1
        return new_tokens, accepted

    def _decode(self, ids: list[int]) -> str | None:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else None


def _first(value):
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)
