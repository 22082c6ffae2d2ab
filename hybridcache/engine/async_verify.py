"""Asynchronous verify: a verify step whose drafts are proposed on the device, so it launches before
the step before is read. Each row's tokens are kept there (`TokenHistory`), the step before's accepted
tokens are appended there, and the n-gram search runs there (`NgramDrafter.propose_on_device`). The step
commits every token it feeds (`Planner.commit_unsettled`, an upper bound); the next step's committed
lengths are that step's plus its accepted counts, on the device (`StepTensors.chain`); the read takes the
rejected drafts back (`Planner.settle`). Rows step together until a read: a row that finishes, a new
arrival, a page shortage or a row near its max_tokens reads the in-flight step first (`StepLoop.step`)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..cache.entries import pages_for
from ..ops.triton_support import runs_triton
from .device_sampler import RowParams, greedy_verify_choice, packed_choice, sample
from .interrupts import deferred_interrupts
from .request import Request
from .step_tokens import HostCopy, LogprobCopy, row_params

# A chain of one-token verify steps gives way to plain decode steps (`AsyncVerify.idles`) when every row backs
# off for more than this many steps after the one in flight. A chained one-token step costs the host more than
# a plain one (kimi_linear 1B, batch 1, H200: 1.11 ms a step against 0.75, the same 0.69 ms of GPU work; both
# run the speculative forward, one token a row); leaving the chain costs a read, and rejoining one another read
# with the history's upload (estimated at about a step's host time each, not measured: hence pauses of more
# than a few steps only).
LEAVE_CHAIN_AFTER = 8

if TYPE_CHECKING:
    from .scheduler import ScheduledStep
    from .step_loop import StepLoop


class TokenHistory:
    """history [R, W] int64: row i's prompt and output in its first lengths[i] columns (W: the longest a
    row can grow, prompt + max_tokens, and two steps of `tokens_per_step` past it, which a finishing row's
    discarded step may append); kept for one batch of rows in one order while verify steps chain."""

    def __init__(self, rows: list[Request], device: torch.device, tokens_per_step: int) -> None:
        self.rows = rows
        width = max(len(r.prompt) + r.params.max_tokens for r in rows) + 2 * tokens_per_step
        host = np.full((len(rows), width + 2), -1, dtype=np.int64)  # then each row's length and last token
        for i, r in enumerate(rows):
            tokens = r.tokens
            host[i, : len(tokens)], host[i, -2], host[i, -1] = tokens, len(tokens), tokens[-1]
        pinned = torch.from_numpy(host).pin_memory() if device.type == "cuda" else torch.from_numpy(host)
        both = pinned.to(device, non_blocking=True)  # one copy up
        self.history, self.lengths = both[:, :width], both[:, width].clone()
        self._last = both[:, width + 1].clone()
        self.no_drafts = torch.zeros_like(self.lengths)  # a one-token step's proposed drafts [R] (never written)

    def same_rows(self, rows: list[Request]) -> bool:
        return len(rows) == len(self.rows) and all(a is b for a, b in zip(rows, self.rows))

    def append(self, tokens: torch.Tensor, counts: torch.Tensor) -> None:
        """Row i's first counts[i] of tokens [R, T] follow its history (on the device, no sync; one Triton
        launch on CUDA, `ops/ngram_triton.py`)."""
        if runs_triton(tokens):
            from ..ops.ngram_triton import history_append_triton

            self._last = history_append_triton(self.history, self.lengths, tokens, counts.contiguous())
            return
        R, T = tokens.shape
        at = self.lengths[:, None] + torch.arange(T, device=tokens.device)  # [R, T]
        keep = torch.arange(T, device=tokens.device) < counts[:, None]
        at = at.clamp(max=self.history.shape[1] - 1)
        self.history.scatter_(1, at, torch.where(keep, tokens, self.history.gather(1, at)))
        self.lengths += counts
        self._last = self.history.gather(1, (self.lengths - 1)[:, None])[:, 0]

    def last(self) -> torch.Tensor:
        """[R] each row's last token."""
        return self._last


class PendingVerify:
    """A verify step's chosen tokens [R, T] and counts [R] on the device (the next step reads them there),
    and their copy to the host under way: choice [R, 2 + T] int64 holds each row's count, the drafts it
    proposed (the rest padding), then its tokens (`greedy_verify_choice`'s layout); `read()` waits for the
    copy (the step's one host sync). `logprobs`: the step's, copied back behind them."""

    def __init__(self, choice: torch.Tensor, counts: torch.Tensor, logprobs: LogprobCopy) -> None:
        self.tokens, self.counts, self.logprobs = choice[:, 2:], counts, logprobs
        self._copy = HostCopy(choice)

    def read(self) -> tuple[list[list[int]], list[int], list[int]]:
        """(each row's accepted tokens, each row's count, each row's proposed drafts)."""
        rows = self._copy.read()
        return [row[2 : 2 + row[0]] for row in rows], [row[0] for row in rows], [row[1] for row in rows]


class AsyncVerify:
    """The step loop's asynchronous verify steps (`loop.inflight` holds one as (rows, PendingVerify))."""

    def __init__(self, loop: "StepLoop") -> None:
        self.loop = loop
        self.history: TokenHistory | None = None  # the in-flight rows' tokens on the device
        self.params: RowParams | None = None  # sampled rows: their parameters, output positions chained

    def _in_flight(self) -> bool:
        return self.loop.inflight is not None and isinstance(self.loop.inflight[1], PendingVerify)

    def eligible(self, rows: list[Request]) -> bool:
        """Every row possibly short of its max_tokens with the step in flight; no prefix caching
        (saves need host counts), no tensor-parallel workers (plans broadcast host counts), and a drafter
        that proposes the same on the device (`NgramDrafter.drafts_on_device`). A row that backs off
        drafts here too: every row of a verify step feeds k + 1 tokens anyway (the synchronous step pads
        it); a step where no row drafts feeds one token a row (a plain decode step, chained). A row that
        finishes on the step in flight costs the next step's row, discarded; the request check leaves room
        for its positions."""
        loop = self.loop
        flying = 1 + loop.drafter.k if self._in_flight() else 0
        return (loop.runner.workers is None and loop.manager.planner.prefix is None and loop.drafter.drafts_on_device
                and all(len(r.output) + flying < r.params.max_tokens for r in rows))

    def drafting(self, rows: list[Request]) -> bool:
        """Whether the next step of `rows` drafts: a row drafts unless it backs off (`DraftBackoff`); while
        a step with drafts is in flight, a row that missed on its last drafts also waits for that step's
        result (else each back-off would start with two verify steps, the second decided before the first
        was read). Rows that never miss draft every step."""
        backoff = self.loop.drafter.backoff
        wide = self._in_flight() and self.loop.inflight[1].tokens.shape[1] > 1
        return any(backoff.drafts(r) and not (wide and r.draft_misses) for r in rows)

    def idles(self, rows: list[Request]) -> bool:
        """Whether the chain in flight, one token wide, should give way to plain decode steps: every row backs
        off for more than `LEAVE_CHAIN_AFTER` steps after it (its delivery counts it as one of a row's
        `draft_skip`)."""
        return (self._in_flight() and self.loop.inflight[1].tokens.shape[1] == 1
                and min(r.draft_skip for r in rows) > LEAVE_CHAIN_AFTER + 1)

    def chained(self, rows: list[Request]) -> bool:
        """Whether a verify step of `rows` is in flight (a step of theirs may chain on it)."""
        return self._in_flight() and self.continues(rows)

    def continues(self, rows: list[Request]) -> bool:
        """Whether a verify step of `rows` chains on the one in flight (the same rows, in the same order)."""
        return self.history is not None and self.history.same_rows(rows)

    def fits(self) -> bool:
        """With a verify step in flight: the next one's pages are free without preempting anyone (a
        preemption reads committed lengths, which must be settled first)."""
        if not self._in_flight():
            return True
        loop = self.loop
        planner, T = loop.manager.planner, 1 + loop.drafter.k
        running, free = loop.scheduler.running, planner.page_pool.num_free
        if not planner.has_pages or free >= len(running) * pages_for(T, planner.page_size):
            return True  # T more tokens take a row at most ⌈T / page size⌉ new pages
        return sum(planner.pages_needed(r.req_id, T) for r in running) <= free

    def launch(self, step: "ScheduledStep") -> None:
        """Draft on the device, plan, launch and commit a verify step unsettled, then read the step before.
        The step feeds k + 1 tokens a row when a row drafts, else one (no drafts: a plain decode step that
        chains on the steps in flight as a verify step does)."""
        loop = self.loop
        mgr, rows, prev = loop.manager, step.generation, loop.inflight
        k = loop.drafter.k
        T = 1 + k if self.drafting(rows) else 1
        try:
            if prev is None:
                self.history = TokenHistory(rows, loop.device, 1 + k)
            else:
                self.history.append(prev[1].tokens, prev[1].counts)
            if T > 1:
                drafts, proposed = loop.drafter.propose_on_device(self.history.history, self.history.lengths)
                ids = torch.cat([self.history.last()[:, None], drafts], 1).flatten()
            else:
                ids, proposed = self.history.last(), self.history.no_drafts
            with deferred_interrupts():
                plan = mgr.planner.plan_step([r.req_id for r in rows], [T] * len(rows))
            sampling = self._sampling(rows, prev)
            # chosen and accepted inside the graph where one replays
            logits, chosen = loop.runner.run_verify_choice(plan, ids, T, proposed, sampling)
            logits = logits.view(len(rows), T, -1)
            choice, counts = chosen or self._choose(logits, ids.view(len(rows), T), proposed, sampling)
            with deferred_interrupts():
                accept = mgr.planner.device_accept(plan, counts)
                if chosen is None:
                    mgr.store.accept(accept, chain=True)
                else:
                    mgr.store.chain(counts)
                mgr.planner.commit_unsettled(plan)
                for r in rows:
                    r.num_pending += T  # at most T tokens are on their way back
                logprobs = LogprobCopy(rows, logits, choice[:, 2:])
                loop.inflight = (rows, PendingVerify(choice, counts, logprobs))
        except BaseException:
            with deferred_interrupts():
                self.history = None
                if mgr.has_pending_step:
                    loop.scheduler.restart(mgr.abort_step(), loop.requests)
                if loop.inflight is prev and prev is not None:  # its tokens are committed: keep them
                    loop.inflight = None
                    loop.deliver(*prev)
            raise
        if prev is not None:
            loop.deliver(*prev)

    def _sampling(self, rows: list[Request], prev) -> RowParams | None:
        """The rows' sampling parameters, None when all are greedy: uploaded when a chain starts, then each
        step's output positions are the step before's plus its counts (on the device)."""
        if all(r.params.greedy for r in rows):
            return None
        if prev is None:
            self.params = row_params(rows, self.loop.device)
        else:
            self.params = replace(self.params, position=self.params.position + prev[1].counts)
        return self.params

    def _choose(self, logits: torch.Tensor, ids: torch.Tensor, proposed: torch.Tensor,
                sampling: RowParams | None) -> tuple[torch.Tensor, torch.Tensor]:
        """choice [R, 2 + T] (`PendingVerify`'s layout) and counts [R] of a step no graph chose, as the
        synchronous step chooses them: ids [R, T] the fed tokens, each row's last one then its drafts, of
        which only the proposed can pass (the padding never does); sampled rows draw at their output
        positions (`_sampling`)."""
        if sampling is None:
            return greedy_verify_choice(logits, ids, proposed)
        return packed_choice(*sample(logits, replace(sampling, drafts=ids[:, 1:], num_drafts=proposed)), proposed)

    def deliver(self, rows: list[Request], pending: PendingVerify) -> None:
        """The in-flight verify step's tokens and counts (its one host sync): the rejected drafts are taken
        back from the committed lengths, the accepted tokens appended."""
        loop = self.loop
        tokens, counts, proposed = pending.read()
        T = pending.tokens.shape[1]
        with deferred_interrupts():
            loop.manager.planner.settle(counts)
            new_tokens = {}
            for r, toks, c, d in zip(rows, tokens, counts, proposed):
                if r.num_pending:  # 0: aborted, or finished on an earlier step (these are discarded)
                    r.num_pending -= T
                    r.num_prefilled += c  # the fed token and the accepted drafts are in the cache
                    new_tokens[r.req_id] = toks
                    loop.stats.num_draft_tokens += d
                    loop.stats.num_accepted_tokens += c - 1
                    loop.drafter.backoff.after_step(r, d, c - 1)
            logprobs = pending.logprobs.entries(rows, new_tokens)
            loop.ready += loop.finish_rows([r for r in rows if r.req_id in new_tokens], new_tokens, logprobs)
