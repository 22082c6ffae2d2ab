"""A step's token choice: every sampled row's tokens chosen on the device in one call and copied back once
(the step's one host sync), with per-token logprobs for the rows that ask."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .device_sampler import RowParams, sample, sample_greedy
from .request import Request, TokenLogprob
from .scheduler import ScheduledStep


def row_params(rows: list[Request], device: torch.device, drafts: list[list[int]] | None = None, width: int = 0,
               positions: list[int] | None = None) -> RowParams:
    """The rows' sampling parameters on the device in one copy (`RowParams.upload`): each row's drafts
    padded to `width` (none by default) and its output position (its tokens so far by default)."""
    return RowParams.upload([r.params.temperature for r in rows], [r.params.top_k for r in rows],
                            [r.params.top_p for r in rows], [r.seed for r in rows],
                            [len(r.output) for r in rows] if positions is None else positions,
                            [[] for _ in rows] if drafts is None else drafts, width, device)


def choose_tokens(step: ScheduledStep, drafts: dict[int, list[int]], logits: torch.Tensor | None, width: int,
                  device: torch.device, before_read: Callable[[torch.Tensor], None] | None = None,
                  ) -> tuple[dict[int, list[int]], list[int], dict[int, list[TokenLogprob]]]:
    """New tokens per request, and per row the tokens now valid in the cache (context rows: the chunk;
    generation rows: the fed token plus the accepted drafts). Every sampled row is chosen in one batched
    call on the device; its tokens come back in one copy (the step's one host sync). When a row asks for
    logprobs, every row's come back too, in one more copy: {req_id: [TokenLogprob per new token]}.
    `before_read(counts)`: called with the generation rows' counts [len(step.generation)] on the device
    before the copy back (device work queued there overlaps the host's wait)."""
    accepted: list[int] = [chunk for _, chunk in step.context]
    sampled = [r for r, chunk in step.context if r.num_prefilled + chunk == r.context_len and not r.output]
    num_first = len(sampled)
    sampled += step.generation
    if not sampled:
        return {}, accepted, {}
    T = width
    props = [drafts.get(r.req_id, []) if i >= num_first else [] for i, r in enumerate(sampled)]
    if not num_first and all(r.params.greedy and r.params.logprobs is None for r in sampled):
        new_tokens = _choose_greedy(sampled, props, logits, T, device, before_read)
        return new_tokens, accepted + [len(new_tokens[r.req_id]) for r in step.generation], {}
    rows = row_params(sampled, device, props, T - 1)
    # logits rows: a first token reads its prompt's last position; a generation row its T positions
    row = torch.arange(len(sampled), device=device)
    gen = (row >= num_first).long()
    index = row[:, None] + gen[:, None] * ((row[:, None] - num_first) * (T - 1) + torch.arange(T, device=device))
    row_logits = logits[index]  # [R, T, V]
    tokens, counts = sample(row_logits, rows, all_greedy=all(r.params.greedy for r in sampled))
    if before_read is not None and step.generation:
        before_read(counts[num_first:])
    packed = torch.cat([counts[:, None], tokens], 1).tolist()
    new_tokens = {r.req_id: row[1 : 1 + row[0]] for r, row in zip(sampled, packed)}
    accepted += [len(new_tokens[r.req_id]) for r in step.generation]
    return new_tokens, accepted, _logprobs(sampled, row_logits, tokens, new_tokens)


def _choose_greedy(rows: list[Request], drafts: list[list[int]], logits: torch.Tensor, T: int,
                   device: torch.device, before_read: Callable[[torch.Tensor], None] | None) -> dict[int, list[int]]:
    """Generation rows that are all greedy, logits [R * T, V] in row order: `sample_greedy` on them as they
    lie (no per-row parameters to upload, no gather of the logits), one copy back."""
    R = len(rows)
    proposed = np.full((R, T - 1), -1, dtype=np.int64)  # -1: no draft there, never a token
    for i, d in enumerate(drafts):
        proposed[i, : len(d)] = d
    tokens, counts = sample_greedy(logits.view(R, T, -1), torch.from_numpy(proposed).to(device, non_blocking=True))
    if before_read is not None:
        before_read(counts)
    packed = torch.cat([counts[:, None], tokens], 1).tolist()
    return {r.req_id: row[1 : 1 + row[0]] for r, row in zip(rows, packed)}


def _logprobs(sampled: list[Request], row_logits: torch.Tensor, tokens: torch.Tensor,
              new_tokens: dict[int, list[int]]) -> dict[int, list[TokenLogprob]]:
    """Log-probabilities of the sampled tokens [R, T] under the raw logits [R, T, V], with the top N
    (the step's largest ask) of each position, computed on the device and copied back once."""
    found = device_logprobs(sampled, row_logits, tokens)
    return {} if found is None else logprob_entries(sampled, *(t.tolist() for t in found), new_tokens)


def device_logprobs(rows: list[Request], row_logits: torch.Tensor, tokens: torch.Tensor,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """On the device, for rows [R] of which some ask for logprobs (None when none does): the chosen tokens'
    log-probabilities [R, T] under the raw logits [R, T, V] and the top N of each position (N the largest
    ask): (chosen [R, T], top logprobs [R, T, N], top ids [R, T, N])."""
    asks = [r.params.logprobs for r in rows if r.params.logprobs is not None]
    if not asks:
        return None
    logp = torch.log_softmax(row_logits.float(), -1)
    chosen = logp.gather(-1, tokens[..., None])[..., 0]  # [R, T]
    top_lp, top_ids = logp.topk(max(asks), -1) if max(asks) else (logp[..., :0], tokens[..., None][..., :0])
    return chosen, top_lp, top_ids


def logprob_entries(rows: list[Request], chosen: list, top_lp: list, top_ids: list,
                    new_tokens: dict[int, list[int]]) -> dict[int, list[TokenLogprob]]:
    """`device_logprobs`' lists read back, as {req_id: [TokenLogprob per new token]} for the rows that ask."""
    out: dict[int, list[TokenLogprob]] = {}
    for i, r in enumerate(rows):
        n = r.params.logprobs
        if n is None or r.req_id not in new_tokens:
            continue
        out[r.req_id] = [TokenLogprob(t, chosen[i][j], tuple(zip(top_ids[i][j][:n], top_lp[i][j][:n])))
                         for j, t in enumerate(new_tokens[r.req_id])]
    return out


class HostCopy:
    """A device tensor's copy into pinned host memory, started now behind the work queued so far; `read()`
    waits for it (a step's one host sync) and returns it as nested lists."""

    def __init__(self, t: torch.Tensor) -> None:
        if t.is_cuda:
            self._host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self._host.copy_(t, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host, self._ready = t.clone(), None

    def read(self) -> list:
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()


class LogprobCopy:
    """An asynchronous step's `device_logprobs` for rows [R] (logits [R, T, V], chosen tokens [R, T]),
    copied to the host behind the step's tokens; `entries` reads them after the tokens' read."""

    def __init__(self, rows: list[Request], logits: torch.Tensor, tokens: torch.Tensor) -> None:
        found = device_logprobs(rows, logits, tokens)
        self._copies = None if found is None else [HostCopy(t) for t in found]

    def entries(self, rows: list[Request], new_tokens: dict[int, list[int]]) -> dict[int, list[TokenLogprob]]:
        """The rows' logprob entries for their new tokens ({} when no row asked)."""
        if self._copies is None:
            return {}
        return logprob_entries(rows, *(c.read() for c in self._copies), new_tokens)


class PendingTokens:
    """One plain decode step's sampled tokens, left on the device while the host plans the next step:
    `tokens` [R] int64 on the device (the next step's inputs read them there), and a copy to the host
    under way; `read()` waits for that copy (the step's one host sync) and returns them. `logprobs`: the
    step's, copied back behind the tokens (`logprobs.entries` after `read`)."""

    def __init__(self, tokens: torch.Tensor, logprobs: LogprobCopy) -> None:
        self.tokens, self.logprobs = tokens, logprobs
        self._copy = HostCopy(tokens)  # recorded last: its wait covers the copies before it

    def read(self) -> list[int]:
        return self._copy.read()


def sample_plain(rows: list[Request], logits: torch.Tensor, device: torch.device) -> PendingTokens:
    """One token per generation row of a plain decode step (no drafts), chosen on the device and not read:
    logits [R, V]. A row's draw counter counts its tokens still on their way back (`num_pending`), so
    it draws what the synchronous step draws."""
    if all(r.params.greedy for r in rows):
        tokens = logits.argmax(-1)
    else:
        params = row_params(rows, device, positions=[len(r.output) + r.num_pending for r in rows])
        tokens = sample(logits[:, None], params)[0][:, 0]
    return PendingTokens(tokens, LogprobCopy(rows, logits[:, None], tokens[:, None]))
