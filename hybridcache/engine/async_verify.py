"""What an asynchronous verify step keeps on the device: each row's tokens, so the next step's drafts are
proposed there (`NgramDrafter.propose_on_device`) from tokens the host has not read yet, and the step's
chosen tokens and accepted counts, copied back while the next step runs."""
from __future__ import annotations

import numpy as np
import torch

from .request import Request


class TokenHistory:
    """history [R, W] int64: row i's prompt and output in its first lengths[i] columns (W: the longest a
    row can grow, prompt + max_tokens); kept for one batch of rows in one order while verify steps chain."""

    def __init__(self, rows: list[Request], device: torch.device) -> None:
        self.rows = rows
        width = max(len(r.prompt) + r.params.max_tokens for r in rows)
        host = np.full((len(rows), width), -1, dtype=np.int64)
        for i, r in enumerate(rows):
            tokens = r.tokens
            host[i, : len(tokens)] = tokens
        pinned = torch.from_numpy(host).pin_memory() if device.type == "cuda" else torch.from_numpy(host)
        self.history = pinned.to(device, non_blocking=True)
        self.lengths = torch.tensor([len(r.prompt) + len(r.output) for r in rows], dtype=torch.long).to(
            device, non_blocking=True)

    def same_rows(self, rows: list[Request]) -> bool:
        return len(rows) == len(self.rows) and all(a is b for a, b in zip(rows, self.rows))

    def append(self, tokens: torch.Tensor, counts: torch.Tensor) -> None:
        """Row i's first counts[i] of tokens [R, T] follow its history (on the device, no sync)."""
        R, T = tokens.shape
        at = self.lengths[:, None] + torch.arange(T, device=tokens.device)  # [R, T]
        keep = torch.arange(T, device=tokens.device) < counts[:, None]
        at = at.clamp(max=self.history.shape[1] - 1)
        self.history.scatter_(1, at, torch.where(keep, tokens, self.history.gather(1, at)))
        self.lengths += counts

    def last(self) -> torch.Tensor:
        """[R] each row's last token."""
        return self.history.gather(1, (self.lengths - 1)[:, None])[:, 0]


class PendingVerify:
    """A verify step's chosen tokens [R, T] and counts [R] on the device (the next step reads them there),
    and their copy to the host under way, with the drafts each row proposed [R] (the rest padding);
    `read()` waits for it (the step's one host sync)."""

    def __init__(self, tokens: torch.Tensor, counts: torch.Tensor, proposed: torch.Tensor) -> None:
        self.tokens, self.counts = tokens, counts
        packed = torch.cat([counts[:, None], proposed[:, None].to(tokens.dtype), tokens], 1)
        if packed.is_cuda:
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._host.copy_(packed, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host, self._ready = packed.clone(), None

    def read(self) -> tuple[list[list[int]], list[int], list[int]]:
        """(each row's accepted tokens, each row's count, each row's proposed drafts)."""
        if self._ready is not None:
            self._ready.synchronize()
        rows = self._host.tolist()
        return [row[2 : 2 + row[0]] for row in rows], [row[0] for row in rows], [row[1] for row in rows]
