"""The rows of the last planned step, kept between steps so a repeated batch costs only what changed."""
from __future__ import annotations

import numpy as np

from .entries import Entry, Status
from .plans import frozen

_EMPTY = frozen(np.zeros(0, dtype=np.int64))


class Layout:
    """Row order, slots and page-table columns of one batch of entries (a new `version` per new batch).

    While the same rows come back (the common decode case) the page-table writes are only the pages a
    row took since the last step, and no per-row Python runs except for those rows. The planner drops the
    layout whenever a row's status, slot or pages change other than by `allocate`, which calls `grew` (these
    rows again) or `recount` (another batch).
    """

    def __init__(self, key: tuple, entries: list[Entry], version: int) -> None:
        self.key = key
        self.entries = entries
        self.version = version
        self.handles = np.array([e.handle for e in entries], dtype=np.int64)
        self.dummy = frozen(np.array([e.status == Status.DUMMY for e in entries], dtype=bool))
        self.slots = frozen(np.array([e.slot for e in entries], dtype=np.int64))
        self.generation = frozen(np.array([e.status == Status.GENERATION for e in entries], dtype=bool))
        self.written = np.zeros(len(entries), dtype=np.int64)  # page-table columns written per row
        self.width = 1
        self._held: np.ndarray | None = None
        self._fresh: np.ndarray | None = frozen(np.array([e.fresh for e in entries], dtype=bool))
        self._no_fresh = frozen(np.zeros(len(entries), dtype=bool))

    @property
    def held(self) -> np.ndarray:
        """[B] int64: pages each row holds."""
        if self._held is None:
            self._held = np.fromiter((len(e.pages) for e in self.entries), dtype=np.int64, count=len(self.entries))
        return self._held

    def grew(self, grow: np.ndarray) -> None:
        """Row `i` took `grow[i]` more pages (the planner extended the entries' page lists)."""
        self.held[...] += grow

    def recount(self) -> None:
        """Rows may have taken pages by another batch's allocation: count them again on next use."""
        self._held = None

    def take_fresh(self) -> np.ndarray:
        """[B] bool: rows that start from a zero state — only in the layout's first plan, since a row of a
        live layout never becomes WAITING (that drops the layout) — and mark them started."""
        fresh, self._fresh = self._fresh, None
        if fresh is None:
            return self._no_fresh
        for i in np.flatnonzero(fresh).tolist():
            self.entries[i].fresh = False
        return fresh

    def take_writes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, cols, pages) of the page-table entries not yet written; the width doubles as needed."""
        held = self.held
        rows = (held > self.written).nonzero()[0]
        if rows.size == 0:
            return _EMPTY, _EMPTY, _EMPTY
        start = self.written[rows]
        counts = held[rows] - start
        r = np.repeat(rows, counts)
        first = np.cumsum(counts) - counts  # where each row's run starts in the flat output
        c = np.arange(r.size, dtype=np.int64) + np.repeat(start - first, counts)
        v = np.fromiter((p for i, s in zip(rows.tolist(), start.tolist()) for p in self.entries[i].pages[s:]),
                        dtype=np.int64, count=r.size)
        self.written[rows] = held[rows]
        top = int(held.max())
        while self.width < top:
            self.width *= 2
        return frozen(r), frozen(c), frozen(v)
