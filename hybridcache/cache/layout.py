"""The rows of the last planned step, kept between steps so a repeated batch costs only what changed."""
from __future__ import annotations

import numpy as np

from .entries import Entry, Status
from .plans import frozen


class Layout:
    """Row order, slots and page-table columns of one batch of entries (a new `version` per new batch).

    While the same rows come back (the common decode case) the page-table writes are only the pages a
    row took since the last step.
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

    def held_pages(self) -> np.ndarray:
        return np.fromiter((len(e.pages) for e in self.entries), dtype=np.int64, count=len(self.entries))

    def take_writes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, cols, pages) of the page-table entries not yet written; the width doubles as needed."""
        held = self.held_pages()
        rows = np.flatnonzero(held > self.written)
        if rows.size == 0:
            empty = frozen(np.zeros(0, dtype=np.int64))
            return empty, empty, empty
        counts = held[rows] - self.written[rows]
        r = np.repeat(rows, counts)
        c = np.concatenate([np.arange(self.written[i], held[i]) for i in rows.tolist()])
        v = np.fromiter((p for i in rows.tolist() for p in self.entries[i].pages[self.written[i]:]),
                        dtype=np.int64, count=int(counts.sum()))
        self.written[rows] = held[rows]
        top = int(held.max())
        while self.width < top:
            self.width *= 2
        return frozen(r), frozen(c), frozen(v)
