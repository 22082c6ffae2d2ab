"""`LLM`: the public facade — load a checkpoint, build the cache, run requests to completion."""
from __future__ import annotations

import threading
import logging
import weakref
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..cache import StateLostError, Status
from ..models.checkpoint import read_config, read_generation_config
from ..models.loader import load_model, load_tokenizer, model_on_meta
from ..parallel import TPGroup
from ..parallel.workers import Workers
from .cache_build import build_cache
from .drafter import NgramDrafter
from .errors import InvalidParamsError, InvalidRequestError
from .params import SamplingParams, SpeculativeConfig, check_engine_args
from .interrupts import deferred_interrupts
from .prefilled import PrefilledRequest
from .policy import PreemptionPolicy
from .ranks import attach_ranks, start_ranks
from .request import Request, RequestDelta, RequestOutput
from .request_check import RequestCheck
from .stats import Stats
from .runner import ModelRunner
from .step_loop import StepLoop
from .cpu_threads import tune_cpu_threads
from .scheduler import Scheduler

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GENERATION_DEFAULTS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_new_tokens": "max_tokens"}


class LLM:
    """Serve a hybrid checkpoint directory (config.json + *.safetensors) with continuous batching.

    `device_cache_bytes` holds recurrent slots and attention pages; their split follows demand (it is
    re-carved live, bit-exact, when one side runs short while the other sits idle) unless `num_slots`
    fixes it. `host_cache_bytes` is the host tier that suspended requests and spilled prefix-cache entries move
    to (by default as large as the device budget; with prefix caching 4x it, at most a quarter of memory). `scheduling_policy`: "max_utilization" (admit while there is room now, preempt on
    growth) or "reserve" (admit only with room for the whole length, never preempt on growth).

    `enable_prefix_caching` reuses cached prompt prefixes: shared attention pages and recurrent-state
    snapshots every `prefix_snapshot_interval` tokens (default 64, rounded down to the page size), kept in
    up to a fifth of the device cache (docs/cache.md, "Prefix caching").

    `preemption` chooses the victim and swap or re-prefill (`policy.PreemptionPolicy`). On CUDA, decode and
    verify steps replay CUDA graphs captured per batch shape (`enforce_eager=True` runs every step
    eagerly). A step that fails (an exception or Ctrl-C in the forward, the sampler or the drafter)
    restarts its rows from their tokens; `generate` then aborts its requests and re-raises, and the LLM
    stays usable.

    `async_scheduling` (on by default on CUDA): a plain decode step is planned and launched before the tokens
    of the step before are read back, so the host's work overlaps the device's; outputs then come back one
    `step()` later. So is a verify step (n-gram drafts proposed on the device from the tokens kept there,
    `engine/async_verify.py`; greedy and seeded sampled rows alike), without prefix caching. Logprobs and
    tensor or pipeline parallelism take synchronous steps (with `SpeculativeConfig.backoff_max_steps`, the
    steps in which every row backs off are plain decode steps).

    `tensor_parallel_size=N` shards the model and the cache over N ranks (docs/parallel.md): this process
    is rank 0 (it plans, samples and broadcasts each step) and starts the N-1 others itself; a worker
    that dies, or hangs past `parallel_timeout_s`, raises TensorParallelError; so does a worker start (import
    and load of its shard) longer than `parallel_startup_timeout_s`. `device_cache_bytes` is then
    each rank's budget. `pipeline_parallel_size=N` gives each of N ranks a contiguous range of the layers
    and a cache over them (docs/parallel.md); `device_cache_bytes` is then the whole model's budget, each
    stage carving its part. `close()` stops the workers (also done when the LLM is collected, and at exit).
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
        preemption: PreemptionPolicy | None = None,
        enforce_eager: bool = False,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        parallel_timeout_s: float = 120.0,
        parallel_startup_timeout_s: float = 600.0,
        enable_prefix_caching: bool = False,
        prefix_snapshot_interval: int | None = None,
        async_scheduling: bool | None = None,
    ) -> None:
        if dtype not in DTYPES and dtype != "auto":
            raise InvalidParamsError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
        check_engine_args(dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                               page_size=page_size, max_model_len=1 if max_model_len is None else max_model_len,
                               num_slots=1 if num_slots is None else num_slots,
                               tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size),
                          page_size, prefix_snapshot_interval,
                          dict(parallel_timeout_s=parallel_timeout_s, parallel_startup_timeout_s=parallel_startup_timeout_s))
        self.device = torch.device(device)
        cfg = read_config(model)
        tune_cpu_threads(self.device, cfg)
        if dtype == "auto":  # the checkpoint's own dtype; float32 when it names none we run
            dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32").removeprefix("torch.")
            dtype = dtype if dtype in DTYPES else "float32"
        self.dtype = DTYPES[dtype]
        self.workers, stage, tp = start_ranks(model, tensor_parallel_size, pipeline_parallel_size, self.device,
                                              self.dtype, parallel_timeout_s, parallel_startup_timeout_s)
        self._finalizer = weakref.finalize(self, Workers.close, self.workers) if self.workers else None
        self.model = load_model(model, device=self.device, dtype=self.dtype, tp=tp, stage=stage)  # while the workers load theirs
        if self.workers is not None:
            self.workers.connect()
        self.tokenizer = load_tokenizer(model)
        gen_cfg = read_generation_config(model)
        self.vocab_size = int(cfg["vocab_size"])
        # every eos id of config.json and generation_config.json, config.json's first
        self.eos_token_ids = list(dict.fromkeys(_ids(cfg.get("eos_token_id")) + _ids(gen_cfg.get("eos_token_id"))))
        # generation_config.json's sampling defaults, for requests that pass no SamplingParams
        self.default_params = SamplingParams(**{ours: gen_cfg[theirs] for theirs, ours in GENERATION_DEFAULTS.items()
                                                if gen_cfg.get(theirs) is not None})
        self.max_model_len = max_model_len or int(cfg.get("max_position_embeddings") or cfg.get("model_max_length") or 4096)
        self.speculative = speculative
        k = speculative.num_draft_tokens if speculative else 0
        self.verify_tokens = k + 1
        self.drafter = NgramDrafter(speculative) if speculative else None
        # rank 0 plans every stage (its tensor-parallel shard of them)
        planned = self.model if stage is None else model_on_meta(model, self.dtype, TPGroup(0, tp.size))
        built = build_cache(planned, k, page_size, self.device, max_model_len=self.max_model_len,
                            max_num_seqs=max_num_seqs, device_cache_bytes=device_cache_bytes,
                            host_cache_bytes=host_cache_bytes, num_slots=num_slots,
                            enable_prefix_caching=enable_prefix_caching, prefix_snapshot_interval=prefix_snapshot_interval)
        self.manager, self.split, self.sizing = built.manager, built.split, built.sizing
        self.stages = attach_ranks(self.manager, self.model, self.workers, stage, k, page_size)  # pipeline: StageCaches
        if preemption is None:  # pinned copies on an H200 reach about 50 GB/s each way; a CPU memcpy about 5
            preemption = PreemptionPolicy(swap_bytes_per_s=50e9 if self.device.type == "cuda" else 5e9)
        self.scheduler = Scheduler(self.manager, max_num_seqs, max_num_batched_tokens, self.verify_tokens,
                                   scheduling_policy, preemption, self.split)
        if stage is not None:
            from .pipeline import PipelineRunner
            self.runner = PipelineRunner(self.model, self.manager, self.device, speculative is not None, self.workers,
                                         self.stages)
        else:
            self.runner = ModelRunner(self.model, self.manager, self.device, speculative is not None,
                                      cuda_graphs=not enforce_eager, workers=self.workers)
        log.info("%s on %s %s: device cache %d B (%d slots, %d pages of %d tokens), host tier %d B%s",
                 Path(model).name, self.device, dtype, self.manager.config.device_bytes, self.manager.num_slots,
                 self.manager.num_pages, page_size, self.manager.config.host_bytes,
                 "" if self.runner.graphs is None else ", CUDA graphs")
        self.seed = seed
        self._next_id = 0
        self._generate_lock = threading.Lock()
        if async_scheduling is None:  # where the device runs ahead of the host
            async_scheduling = self.device.type == "cuda"
        self.async_scheduling = async_scheduling and self.workers is None
        self._loop = StepLoop(self.scheduler, self.manager, self.runner, self.drafter, self.tokenizer, self.device,
                              self.async_scheduling)
        self._check = RequestCheck(self.tokenizer, self._loop.tokenizer_lock, self.vocab_size, self.max_model_len,
                                   self.verify_tokens, self.manager, self.sizing, self.split)

    # ---------------------------------------------------------------------------------- public
    @property
    def eos_token_id(self) -> int | None:
        """The first eos id (setting it replaces them all)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @eos_token_id.setter
    def eos_token_id(self, value: int | None) -> None:
        self.eos_token_ids = [] if value is None else [int(value)]

    @property
    def stream_deltas(self) -> bool:
        """Record per-step deltas for take_deltas() (the engine core sets it)."""
        return self._loop.stream_deltas

    @stream_deltas.setter
    def stream_deltas(self, value: bool) -> None:
        self._loop.stream_deltas = value

    @property
    def step_hook(self) -> Callable[[], None] | None:
        """Called after every step (tests call check_integrity() here)."""
        return self._loop.step_hook

    @step_hook.setter
    def step_hook(self, hook: Callable[[], None] | None) -> None:
        self._loop.step_hook = hook

    @property
    def stats(self) -> Stats:
        s, m = self._loop.stats, self.manager.stats
        s.num_suspensions, s.num_resumes, s.num_reprefills = m["suspensions"], m["resumes"], m["reprefills"]
        s.bytes_to_host, s.bytes_to_device = m["bytes_to_host"], m["bytes_to_device"]
        s.num_rebalances, s.num_aborted_rows = m["rebalances"], m["aborted_rows"]
        prefix = self.manager.planner.prefix
        if prefix is not None:
            p = prefix.stats
            s.prefix_cache_queries, s.prefix_cache_hits = p["queries"], p["hits"]
            s.prefix_cache_evictions, s.num_snapshots_saved = p["evictions"], p["snapshots_saved"]
            s.prefix_cache_spills, s.prefix_cache_host_hits = p["spills"], p["host_hits"]
            s.num_snapshots, s.snapshot_bytes = prefix.snap_pool.num_owned, self.manager.snapshot_bytes
        return s

    def rebalance(self, num_slots: int) -> int:
        """Change the device split between recurrent slots and attention pages while requests are live;
        requests that no longer fit are preempted, the rest move with every role. Refused
        (BudgetTooSmallError, nothing changed) when the split could not run the longest request known."""
        with deferred_interrupts():
            self._loop.settle()
            try:
                return self.scheduler.rebalance(num_slots)
            except StateLostError:
                self._loop.restart_lost()
                raise

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix no request is using (vLLM's name; e.g. before a measured run, or
        after the weights changed). True when nothing cached is left; False while running requests still
        hold cached prefixes (those stay) or prefix caching is off."""
        with deferred_interrupts():
            return self.manager.reset_prefix_cache()

    def device_bytes_needed(self, num_tokens: int) -> int:
        """Device bytes one request of `num_tokens` tokens holds: its pages and its slot, every role.
        A budget of `device_bytes_needed(L + num_draft_tokens + 1)` runs any one request of length L; N
        times that runs N at once."""
        return self.manager.device_bytes_needed(num_tokens)

    def generate(
        self,
        prompts: Sequence[Sequence[int]] | Sequence[str],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order. All prompts are checked
        before any runs: a bad one raises and nothing is queued. If anything raises while they run
        (Ctrl-C included), their requests are aborted and the error reaches the caller.

        Requests queued before with `add_request` run alongside; their outputs are returned by the next
        `step()`. One caller at a time: a second thread (or the progress callback, or an engine core
        running this LLM) gets InvalidRequestError at once."""
        if not self._generate_lock.acquire(blocking=False):
            raise InvalidRequestError(
                "generate() is already running on this LLM (another thread, its progress callback, or an engine "
                "core): an LLM serves one caller at a time; use one LLM per thread or the engine core"
            )
        try:
            return self._generate(prompts, sampling_params, progress)
        finally:
            self._generate_lock.release()

    def _generate(self, prompts, sampling_params, progress) -> list[RequestOutput]:
        params = sampling_params or self.default_params
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        encoded = [self._check.encode(p) for p in prompts]
        for ids, p in zip(encoded, plist):
            self._check.validate(ids, p)
        rids: list[int] = []
        done: dict[int, RequestOutput] = {}
        try:
            with deferred_interrupts():  # a Ctrl-C while queueing comes after: every queued request is in rids
                for ids, p in zip(encoded, plist):
                    rids.append(self.add_request(ids, p))
            ours = set(rids)
            while len(done) < len(rids):
                for out in self.step():
                    if out.request_id in ours:
                        done[out.request_id] = out
                    else:
                        self._loop.held.append(out)
                if progress:
                    progress(len(done), len(rids))
        except BaseException:
            with deferred_interrupts():
                for rid in rids:
                    if rid not in done:
                        self.abort_request(rid)
                ours = set(rids)
                self._loop.ready = [o for o in self._loop.ready if o.request_id not in ours]
            raise
        return [done[r] for r in rids]

    def add_request(self, prompt: Sequence[int] | str, params: SamplingParams | None = None) -> int:
        """Queue one request; raises InvalidRequestError (queueing nothing) on bad input."""
        params = params or self.default_params
        ids = self._check.encode(prompt)
        self._check.validate(ids, params)
        with deferred_interrupts():
            rid = self._next_id
            seed = params.seed if params.seed is not None else self.seed * 1_000_003 + rid
            req = Request(rid, ids, params, tuple(self.eos_token_ids), arrival=rid, seed=_int64(seed))
            self.scheduler.add(req)
            self._loop.requests[rid] = req
            self._next_id += 1
        return rid

    def take_prefilled(self, request_id: int) -> PrefilledRequest | None:
        """Hand over a request whose prompt is in the cache and whose first token is sampled (status
        GENERATION): its tokens and live cache state leave this LLM, which forgets it (disaggregated prefill,
        `hybridcache.disagg`). None when it is not at that point (unknown and finished ids included)."""
        req = self._loop.requests.get(request_id)
        if (req is None or req.finished or self.manager.status(request_id) != Status.GENERATION
                or len(req.output) != 1 or self.manager.entry(request_id).num_tokens != len(req.prompt)):
            return None  # not there yet, or past it (a decode step ran)
        with deferred_interrupts():
            slot_record, page_records = self.manager.export_records(request_id)
            out = PrefilledRequest(list(req.prompt), list(req.output), req.params, req.seed, slot_record,
                                   page_records, None if req.logprobs is None else list(req.logprobs))
            self._loop.requests.pop(request_id)
            self.scheduler.finish(req)
        return out

    def add_prefilled(self, p: PrefilledRequest) -> int:
        """Queue a request another engine prefilled (`take_prefilled` there, with the same cache layouts): it
        joins as a suspended request and resumes like one. Raises (queueing nothing) on bad input."""
        ids = self._check.encode(p.prompt)
        self._check.validate(ids, p.params)
        with deferred_interrupts():
            self._loop.settle()
            rid = self._next_id
            req = Request(rid, ids, p.params, tuple(self.eos_token_ids), arrival=rid, seed=_int64(p.seed),
                          output=[int(t) for t in p.output], num_prefilled=len(ids),
                          logprobs=None if p.logprobs is None else list(p.logprobs))
            self.manager.adopt(rid, len(ids), p.slot_record, p.page_records)
            self.scheduler.suspended.append(req)  # the newest arrival: the queue stays in arrival order
            self._loop.requests[rid] = req
            self._next_id += 1
        return rid

    def abort_request(self, request_id: int) -> None:
        """Stop a request and release everything it holds; unknown or finished ids are ignored."""
        self._loop.abort(request_id)

    def take_deltas(self) -> list[RequestDelta]:
        """Per-request progress since the last call (recorded while `stream_deltas` is set): each step's
        new tokens, text and logprobs, and a last delta with the finish reason (abort included)."""
        deltas, self._loop.deltas = self._loop.deltas, []
        return deltas

    def check_request(self, prompt: Sequence[int] | str, params: SamplingParams) -> list[int]:
        """The prompt's token ids if `add_request` would accept it; raises InvalidRequestError otherwise.
        Reads only what a step never changes, so another thread may call it while this LLM runs."""
        ids = self._check.encode(prompt)
        self._check.validate(ids, params)
        return ids

    def has_unfinished(self) -> bool:
        return self._loop.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """One scheduler step and one forward; returns the requests that finished in it (with asynchronous
        decode, those that finished in the step before). If it raises, the step's rows restart from their
        tokens and stay queued."""
        return self._loop.step()

    def close(self) -> None:
        """Stop the tensor-parallel workers (nothing to do for one rank); the LLM cannot step afterwards."""
        if self._finalizer is not None:
            self._finalizer()

def _int64(seed: int) -> int:
    """A seed in [0, 2^64) as the int64 with the same bits."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _ids(value) -> list[int]:
    """An eos entry of a config (an id, a list of them, or None) as a list."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
