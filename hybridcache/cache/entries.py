"""What the planner knows of one request: its lifecycle status and what it holds in each tier."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Hashable

import numpy as np


class Status(IntEnum):
    """The one lifecycle of a request, shared by the cache and the engine (ordered: `> SUSPENDED` is over)."""

    WAITING = 0  # holds nothing; its next step starts its context from a zero state
    CONTEXT = 1  # prefill chunks; holds a device slot and pages
    GENERATION = 2  # decode / verify steps; holds a device slot and pages
    SUSPENDED = 3  # holds a host slot and host pages only
    FINISHED = 4  # freed; the engine keeps the request's output, the cache nothing
    DUMMY = 5  # padding row: a permanent device slot, never saved


class TokenCounts:
    """Committed-token counts of all requests in one array, so a step updates a batch in one operation."""

    def __init__(self, capacity: int = 64) -> None:
        self.counts = np.zeros(capacity, dtype=np.int64)
        self._free = list(range(capacity - 1, -1, -1))

    def take(self) -> int:
        if not self._free:
            old = len(self.counts)
            self.counts = np.concatenate([self.counts, np.zeros(old, dtype=np.int64)])
            self._free = list(range(2 * old - 1, old - 1, -1))
        handle = self._free.pop()
        self.counts[handle] = 0
        return handle

    def give_back(self, handle: int) -> None:
        self._free.append(handle)


@dataclass(eq=False)
class Entry:
    req_id: Hashable
    status: Status
    store: TokenCounts
    handle: int
    slot: int = -1
    pages: list[int] = field(default_factory=list)
    host_slot: int = -1
    host_pages: list[int] = field(default_factory=list)
    fresh: bool = False  # took its slot since the last planned step: the slot must be zeroed first
    # prefix caching (cache/prefix_cache.py): a pinned snapshot id its first step restores (-1: none), the
    # token counts at which it saves a snapshot while in CONTEXT and which of them are branch points, its
    # page hashes so far, and the node of its latest tail snapshot (saved or restored; not a branch point),
    # which its next tail snapshot replaces
    restore: int = -1
    copy_src: int = -1  # a pinned tail page its first step copies into its own page (-1: none)
    keeps: tuple[int, ...] = ()
    branches: tuple[int, ...] = ()
    hashes: list[bytes] = field(default_factory=list)
    tail_node: object = None

    @property
    def num_tokens(self) -> int:
        """Tokens whose K/V and recurrent state are committed."""
        return int(self.store.counts[self.handle])

    @num_tokens.setter
    def num_tokens(self, value: int) -> None:
        self.store.counts[self.handle] = value

    @property
    def on_device(self) -> bool:
        return self.status in (Status.CONTEXT, Status.GENERATION)


def pages_for(num_tokens, page_size: int):
    """Pages that hold `num_tokens` tokens (an int, or elementwise over a numpy array)."""
    return -(-num_tokens // page_size)
