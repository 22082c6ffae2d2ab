"""The engine's step: schedule, plan, run the model, choose tokens, commit, and move the requests on —
synchronously, as asynchronous plain decode, or as asynchronous greedy verify. It holds the live requests and the outputs not yet
returned; `LLM` (the facade) admits and aborts requests and calls `step()`."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import numpy as np
import torch

from ..cache import HybridCacheManager, StateLostError, Status
from .async_verify import AsyncVerify, PendingVerify
from .drafter import NgramDrafter
from .interrupts import deferred_interrupts
from .request import Request, RequestDelta, RequestOutput, TokenLogprob
from .scheduler import ScheduledStep, Scheduler
from .stats import Stats
from .step_tokens import PendingTokens, choose_tokens, row_params, sample_plain

log = logging.getLogger(__name__)


class StepLoop:
    """`requests`: the live requests by id; `ready`: outputs of committed steps not yet returned; `held`: others'
    outputs that finished inside `LLM.generate` (the next `step()` returns them); `deltas`: per-step progress
    while `stream_deltas` is set; `inflight`: an asynchronous step whose tokens are not yet read back."""

    def __init__(self, scheduler: Scheduler, manager: HybridCacheManager, runner: Any, drafter: NgramDrafter | None,
                 tokenizer: Any, device: torch.device, async_scheduling: bool) -> None:
        self.scheduler, self.manager, self.runner, self.drafter = scheduler, manager, runner, drafter
        self.tokenizer, self.device, self.async_scheduling = tokenizer, device, async_scheduling
        self.tokenizer_lock = threading.Lock()  # a fast tokenizer used from two threads can fail ("Already borrowed")
        self.stats = Stats()
        self.requests: dict[int, Request] = {}
        self.ready: list[RequestOutput] = []
        self.held: list[RequestOutput] = []
        self.deltas: list[RequestDelta] = []
        self.stream_deltas = False  # record per-step deltas (the engine core sets it)
        self.step_hook: Callable[[], None] | None = None  # tests call check_integrity() here
        self.inflight: tuple[list[Request], PendingTokens | PendingVerify] | None = None
        self.verify = AsyncVerify(self)  # asynchronous greedy verify steps

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work or self.inflight is not None

    def abort(self, request_id: int) -> None:
        """Stop a request and release everything it holds; unknown or finished ids are ignored."""
        with deferred_interrupts():
            req = self.requests.pop(request_id, None)
            if req is not None:
                req.num_pending = 0  # tokens still on their way back are discarded
            if req is not None and not req.finished:
                self.scheduler.finish(req)
                req.finish("abort")
                if self.stream_deltas:
                    self.deltas.append(req.take_delta(self.tokenizer is not None))

    def step(self) -> list[RequestOutput]:
        """One scheduler step and one forward; returns the requests that finished in it (with asynchronous
        decode, those that finished in the step before). If it raises, the step's rows restart from their
        tokens and stay queued."""
        start = time.perf_counter()
        if self.inflight is not None and not (self._steady() and self.verify.fits()):
            self.read_inflight()  # who runs next may depend on those tokens
        with deferred_interrupts():
            try:
                step = self.scheduler.schedule()
            except StateLostError:  # a re-split lost the live state
                self.restart_lost()
                raise
        if step.empty:
            self.read_inflight()
            return self.take_ready()
        kind = self._async_kind(step)
        if self.inflight is not None and not self._continues(step, kind):
            self.read_inflight()
            step = ScheduledStep([(r, c) for r, c in step.context if not r.finished],
                                 [r for r in step.generation if not r.finished])
            if step.empty:  # every row finished on the tokens just read
                return self.take_ready()
            kind = self._async_kind(step)  # nothing in flight now
        if kind == "decode":
            self._launch(step)
        elif kind == "verify":
            self.verify.launch(step)
        else:
            self._run_step(step)
        self.stats.num_steps += 1
        self.stats.step_seconds += time.perf_counter() - start
        if not self.scheduler.has_work and self.inflight is None:
            self.manager.check_integrity()  # idle: every id must be back in its pool
        if self.step_hook:
            self.step_hook()
        return self.take_ready()

    def _run_step(self, step: ScheduledStep) -> None:
        """Plan, run, sample, read the tokens back and commit: the synchronous step."""
        drafts = self._draft(step)
        longest = max(map(len, drafts.values()), default=0)
        try:
            with deferred_interrupts():
                plan, tokens, positions = self._plan(step, drafts, 1 + longest)
            if self._chooses_in_graph(step):
                inputs = self._choice_inputs(step, tokens, drafts, 1 + longest)
                logits, chosen = self.runner.run_verify_choice(plan, *inputs)
            else:
                logits, chosen = self.runner.run(plan, tokens, len(step.context), 1 + longest, positions), None
            early: list[bool] = []

            def accept_on_device(counts: torch.Tensor) -> None:
                # the verify rows' bookkeeping is queued behind the sampling, before the host waits for
                # the tokens (a tensor-parallel store broadcasts host counts instead, after the read)
                if self.runner.workers is None:
                    self.manager.store.accept(self.manager.planner.device_accept(plan, counts))
                    early.append(True)

            if chosen is not None:  # the graph chose and accepted: read its block (the step's one host sync)
                rows = chosen[0].tolist()
                new_tokens = {r.req_id: row[2 : 2 + row[0]] for r, row in zip(step.generation, rows)}
                accepted, logprobs = [row[0] for row in rows], {}
                early.append(True)
            else:
                new_tokens, accepted, logprobs = choose_tokens(step, drafts, logits, 1 + longest, self.device,
                                                               accept_on_device)
            with deferred_interrupts():
                # planner and store directly, as the runner executes: a failed accept hook leaves the step
                # pending, so the handler below restarts its rows (the facade's accept would abort it unseen)
                accept = self.manager.planner.check_accept(plan, accepted)
                if not early:
                    self.manager.store.accept(accept)
                self.manager.planner.commit_step(plan, accept)
                self._save_snapshots(new_tokens)
                self.ready += self._advance(step, drafts, new_tokens, logprobs)  # kept if a held Ctrl-C fires now
        except BaseException:
            with deferred_interrupts():
                if self.manager.has_pending_step:  # nothing committed: the rows run again (same draws)
                    self.scheduler.restart(self.manager.abort_step(), self.requests)
            raise

    def _chooses_in_graph(self, step: ScheduledStep) -> bool:
        """A synchronous step whose graph can choose its tokens (`ModelRunner.run_verify_choice`): generation
        rows only, CUDA graphs on, one process, no row asking for logprobs (those need the logits read)."""
        return (not step.context and self.runner.graphs is not None and self.runner.workers is None
                and all(r.params.logprobs is None for r in step.generation))

    def _choice_inputs(self, step: ScheduledStep, tokens: np.ndarray, drafts: dict[int, list[int]], width: int):
        """(token ids [B * width], verify width, proposed [B], sampling or None) on the device for
        `run_verify_choice`; the ids and the draft counts go up in one copy."""
        rows = step.generation
        proposed = np.array([len(drafts.get(r.req_id, [])) for r in rows], dtype=np.int64)
        up = torch.from_numpy(np.concatenate([tokens, proposed])).to(self.device, non_blocking=True)
        sampling = None if all(r.params.greedy for r in rows) else row_params(rows, self.device)
        return up[: len(tokens)], width, up[len(tokens) :], sampling

    # ------------------------------------------------------------------ asynchronous plain decode
    # A plain decode step's tokens are not needed on the host to plan the next one: every row accepts
    # exactly its one token, so the step commits as soon as it is launched, and the next step feeds the
    # sampled tokens from the device. The host reads them back only after launching that next step, so
    # its planning overlaps the device's work. A request that stops on a token computes one more step,
    # which is discarded; one that reaches max_tokens is released at its last step's commit. With prefix
    # caching, a step's snapshots are saved once the step before is read back (the tokens this step fed are
    # then known for hashing) and before the next step is launched (the slots still hold this step's state).
    def _steady(self) -> bool:
        """Whether the next schedule can only give generation rows (then it may overlap the in-flight step)."""
        s = self.scheduler
        return not s.waiting and not s.suspended and all(s.status(r) == Status.GENERATION for r in s.running)

    def _async_kind(self, step: ScheduledStep) -> str | None:
        """"decode": a plain decode step (generation rows only, none drafting; logprobs come back behind the
        tokens, in both kinds);
        "verify": an asynchronous verify step (`async_verify.AsyncVerify`), also for rows that draft nothing
        while the verify steps before them are in flight, unless all of them back off long enough to leave the
        chain (`AsyncVerify.idles`); None: the synchronous step."""
        rows = step.generation
        if not self.async_scheduling or step.context or not rows:
            return None
        drafting = self.drafter is not None and self.verify.drafting(rows)
        if not drafting and (not self.verify.chained(rows) or self.verify.idles(rows)):
            return "decode"  # a long back-off leaves the chain in flight: one read, then plain steps
        # rows that back off a few steps while a verify chain is in flight go on in it, one token each (no read
        # between)
        return "verify" if self.verify.eligible(rows) else (None if drafting else "decode")

    def _continues(self, step: ScheduledStep, kind: str | None) -> bool:
        """Whether `step`, of `kind` (`_async_kind`), may launch before the in-flight step is read: the same
        kind, and for verify the same rows in the same order (their tokens and lengths chain on the device)."""
        if isinstance(self.inflight[1], PendingVerify):
            return kind == "verify" and self.verify.continues(step.generation)
        return kind == "decode"

    def _launch(self, step: ScheduledStep) -> None:
        """Plan and launch a plain decode step, commit it, then read the step before it back."""
        rows, prev, last = step.generation, self.inflight, []
        try:
            with deferred_interrupts():
                plan = self.manager.planner.plan_step([r.req_id for r in rows], [1] * len(rows))
            ids = self._device_inputs(rows, prev)
            logits = self.runner.run(plan, ids, 0, 1, np.arange(len(rows)))
            pending = sample_plain(rows, logits, self.device)
            with deferred_interrupts():
                accept = self.manager.planner.check_accept(plan, [1] * len(rows))
                self.manager.store.accept(accept)
                self.manager.planner.commit_step(plan, accept)
                for r in rows:
                    r.num_prefilled += 1  # the fed token is in the cache; the sampled one is on its way
                    r.num_pending += 1
                    if self.drafter is not None:
                        self.drafter.backoff.after_step(r, 0, 0)
                    if len(r.output) + r.num_pending >= r.params.max_tokens:  # its last token: release it
                        last.append(r)
                self.inflight = (rows, pending)
        except BaseException:
            with deferred_interrupts():
                if self.manager.has_pending_step:
                    self.scheduler.restart(self.manager.abort_step(), self.requests)
                if self.inflight is prev and prev is not None:  # its tokens are committed: keep them
                    self.inflight = None
                    self.deliver(*prev)
            self._release(last)
            raise
        if prev is not None:
            self.deliver(*prev)
        self._save_snapshots({})
        self._save_ends(last)
        self._release(last)

    def _release(self, rows: list[Request]) -> None:
        """Rows whose last token is in flight leave the cache now (it is delivered later)."""
        with deferred_interrupts():
            for r in rows:
                if not r.finished:
                    self.scheduler.finish(r)
                    r.finish("length")

    def _device_inputs(self, rows: list[Request], prev) -> torch.Tensor | np.ndarray:
        """Each row's input token: the last known one, or the in-flight step's sample, read on the device."""
        if prev is not None and len(rows) == len(prev[0]) and all(
                a is b and a.num_pending for a, b in zip(rows, prev[0])):
            return prev[1].tokens  # a steady batch: every row feeds what it sampled, in the same order
        known = np.asarray([r.last_token if not r.num_pending else 0 for r in rows], dtype=np.int64)
        if prev is None:
            return known
        where = {id(r): i for i, r in enumerate(prev[0])}
        index = np.asarray([where[id(r)] if r.num_pending else -1 for r in rows], dtype=np.int64)
        both = torch.from_numpy(np.stack([known, index])).to(self.device, non_blocking=True)
        return torch.where(both[1] >= 0, prev[1].tokens[both[1].clamp(min=0)], both[0])

    def settle(self) -> None:
        """Read an in-flight verify step: until then its rows' committed lengths are upper bounds, and the
        cache refuses what reads them (a rebalance, an adoption)."""
        if self.inflight is not None and isinstance(self.inflight[1], PendingVerify):
            self.read_inflight()

    def read_inflight(self) -> None:
        if self.inflight is not None:
            rows_pending, self.inflight = self.inflight, None
            self.deliver(*rows_pending)

    def deliver(self, rows: list[Request], pending) -> None:
        """The in-flight step's tokens (its one host sync), appended to the requests still waiting for them."""
        if isinstance(pending, PendingVerify):
            return self.verify.deliver(rows, pending)
        tokens = pending.read()
        with deferred_interrupts():
            new_tokens = {}
            for r, t in zip(rows, tokens):
                if r.num_pending:  # 0: aborted, or stopped on an earlier token (this one is discarded)
                    r.num_pending -= 1
                    new_tokens[r.req_id] = [t]
            logprobs = pending.logprobs.entries(rows, new_tokens)
            self.ready += self.finish_rows([r for r in rows if r.req_id in new_tokens], new_tokens, logprobs)

    def take_ready(self) -> list[RequestOutput]:
        """Outputs of committed steps not yet returned (a Ctrl-C can land right after a commit)."""
        ready, self.ready, self.held = self.held + self.ready, [], []
        return ready

    def restart_lost(self) -> None:
        """A rebalance lost the live state and the cache restarted those requests from their tokens
        (WAITING): the scheduler restarts them too."""
        lost = [r.req_id for r in self.scheduler.running + self.scheduler.suspended
                if self.manager.status(r.req_id) == Status.WAITING]  # suspended ones kept shared device pages
        self.scheduler.restart(lost, self.requests)

    def _save_snapshots(self, new_tokens: dict[int, list[int]]) -> None:
        """Prefix caching: save the snapshots the committed step's rows reached. A failed save indexes
        nothing and costs only future hits, so it is logged, not raised."""
        if self.manager.planner.prefix is None:
            return
        reqs = self.requests
        try:
            self.manager.save_snapshots(lambda rid: reqs[rid].tokens + new_tokens.get(rid, []))
        except Exception:
            log.exception("saving prefix-cache snapshots failed; none of this step's were kept")

    def _draft(self, step: ScheduledStep) -> dict[int, list[int]]:
        """Each generation row's proposal. The runner pads them to the step's longest (one verify shape);
        only a row's own drafts are judged, so its tokens and random draws never depend on its batch."""
        if self.drafter is None:
            return {}
        drafts = {r.req_id: self.drafter.propose(r.tokens) for r in step.generation if self.drafter.backoff.drafts(r)}
        if self.manager.planner.prefix is not None:
            # a greedy row's commit lands on each snapshot boundary, never past it (fewer drafts change no
            # greedy token; a sampled row's draws depend on its drafts, so it keeps them and may jump one)
            for r in (r for r in step.generation if r.params.greedy and r.req_id in drafts):
                room = self.manager.planner.next_keep(r.req_id) - r.num_prefilled - 1
                drafts[r.req_id] = drafts[r.req_id][: max(room, 0)]
        return drafts

    def _plan(self, step: ScheduledStep, drafts: dict[int, list[int]], width: int):
        """The step plan, the flat token ids and the flat positions whose logits are needed: a context
        row's last token when its prompt is done, every position of a generation row."""
        ids, counts, tokens, positions, offset = [], [], [], [], 0
        for req, chunk in step.context:
            ids.append(req.req_id)
            counts.append(chunk)
            tokens += req.tokens[req.num_prefilled : req.num_prefilled + chunk]
            offset += chunk
            if req.num_prefilled + chunk == req.context_len and not req.output:
                positions.append(offset - 1)
        for req in step.generation:
            ids.append(req.req_id)
            counts.append(width)
            last = req.last_token
            tokens += [last] + NgramDrafter.pad(drafts.get(req.req_id, []), last, width - 1)
            positions += range(offset, offset + width)
            offset += width
        plan = self.manager.planner.plan_step(ids, counts)
        return plan, np.asarray(tokens, dtype=np.int64), np.asarray(positions, dtype=np.int64)

    def _advance(self, step: ScheduledStep, drafts: dict[int, list[int]], new_tokens: dict[int, list[int]],
                 logprobs: dict[int, list[TokenLogprob]]) -> list[RequestOutput]:
        """Move the requests past the committed step; returns the finished ones."""
        for req, chunk in step.context:
            req.num_prefilled += chunk
            if req.num_prefilled == req.context_len:
                self.manager.start_generation(req.req_id)
        for req in step.generation:
            req.num_prefilled += len(new_tokens[req.req_id])  # the fed token and the accepted drafts
            self.stats.num_draft_tokens += len(drafts.get(req.req_id, []))
            self.stats.num_accepted_tokens += len(new_tokens[req.req_id]) - 1
            if self.drafter is not None:
                self.drafter.backoff.after_step(req, len(drafts.get(req.req_id, [])), len(new_tokens[req.req_id]) - 1)
        return self.finish_rows([r for r, _ in step.context] + step.generation, new_tokens, logprobs)

    def finish_rows(self, reqs: list[Request], new_tokens: dict[int, list[int]],
                     logprobs: dict[int, list[TokenLogprob]]) -> list[RequestOutput]:
        """Append each request's new tokens; returns the requests that finished (the cache saves their end
        state for the prefix cache, then forgets them)."""
        ending: list[tuple[Request, bool]] = []
        for req in reqs:
            toks = new_tokens.get(req.req_id)
            if toks is None:
                continue
            before, released = len(req.output), req.finished  # released: an asynchronous step's last token
            done = req.append(toks, logprobs.get(req.req_id))
            if self.tokenizer is not None and (done or req.params.stop or self.stream_deltas):
                with self.tokenizer_lock:
                    stopped = req.update_text(self.tokenizer)
                if stopped:  # a stop string: the text ends before it
                    req.finish("stop")
                    done = True
            if done:
                ending.append((req, released))
            if self.stream_deltas:
                self.deltas.append(req.take_delta(self.tokenizer is not None))
            self.stats.num_generated_tokens += len(req.output) - before
        self._save_ends([req for req, released in ending if not released])
        finished = []
        for req, released in ending:
            if not released:
                self.scheduler.finish(req)
            req.num_pending = 0  # a later step's token of a stopped request is discarded
            self.requests.pop(req.req_id, None)
            finished.append(RequestOutput(req.req_id, req.prompt, list(req.output),
                                          req.text if self.tokenizer is not None else None,
                                          req.finish_reason, req.logprobs))
        return finished

    def _save_ends(self, reqs: list[Request]) -> None:
        """Prefix caching: save where the finishing requests end (a conversation's next turn starts there);
        a failed save is logged, as in `_save_snapshots`."""
        if self.manager.planner.prefix is None or not reqs:
            return
        tokens = {r.req_id: r.tokens for r in reqs}
        try:
            self.manager.save_snapshots(tokens.__getitem__, ends=list(tokens))
        except Exception:
            log.exception("saving the prefix-cache snapshots of finished requests failed; none were kept")
