"""`PlannerCore`: the planner's state and the queries and checks every part of it uses.

It owns the id pools of both tiers and every request's entry; it never touches a tensor. The operations
live beside it, one job per file (`lifecycle.py`, `steps.py`, `prefix.py`, `rebalance.py`), and
`Planner` (`__init__.py`) is all of them.
"""
from __future__ import annotations

from typing import Hashable, Iterable

import numpy as np

from ..entries import Entry, Status, TokenCounts, pages_for
from ..errors import DoubleFreeError, IntegrityError, InvalidTransitionError, UnknownRequestError
from ..id_pool import IdPool
from ..integrity import check_integrity
from ..layout import Layout
from ..plans import MovePlan, RecarvePlan, StepPlan
from ..prefix_cache import PrefixCache

FREED_REMEMBERED = 4096  # freed ids kept to tell a double free from an unknown id


class PlannerCore:
    """The planner's state — slots and pages of both tiers, and what each request holds — its queries and
    the checks its operations share.

    `num_slots` request slots beside `num_dummies` permanent ones, `num_pages` pages; `has_pages` False
    for a model without attention layers (it holds no pages). With `snapshot_interval` > 0, prefix
    caching (`prefix_cache.py`) keeps up to `num_snapshots` recurrent snapshots in slot rows between the
    dummies and the request slots.
    """

    def __init__(
        self, page_size: int, has_pages: bool, num_slots: int, num_pages: int, num_dummies: int,
        host_slots: int, host_pages: int, num_snapshots: int = 0, snapshot_interval: int = 0,
    ) -> None:
        self.page_size = page_size
        self.has_pages = has_pages
        self.num_dummies = num_dummies
        self.num_fixed = num_dummies + num_snapshots  # slot rows that keep their ids: dummies, then snapshots
        self.slot_pool = IdPool(num_slots + self.num_fixed, permanent=self.num_fixed)
        self.page_pool = IdPool(num_pages)
        self.host_slot_pool = IdPool(host_slots)
        self.host_page_pool = IdPool(host_pages)
        self._tokens = TokenCounts()
        self._entries: dict[Hashable, Entry] = {}
        self._freed: dict[Hashable, None] = {}  # recently freed ids, oldest first (for DoubleFreeError)
        self._free_dummy_slots = list(range(num_dummies - 1, -1, -1))
        self._layout: Layout | None = None
        self._version = 0
        self.pending: StepPlan | None = None
        # verify steps committed before their counts were read (`Steps.commit_unsettled`), oldest first:
        # (the rows' entries, None for a row restarted since; tokens each committed), until `settle` takes
        # their rejected drafts back
        self.unsettled: list[tuple[list[Entry | None], np.ndarray]] = []
        self.short_pages = 0  # set by `_room`
        self._moving: MovePlan | RecarvePlan | None = None
        self.stats = {"suspensions": 0, "resumes": 0, "reprefills": 0, "aborted_rows": 0, "rebalances": 0,
                      "bytes_to_host": 0, "bytes_to_device": 0}
        self.prefix = PrefixCache(self, num_snapshots, snapshot_interval) if snapshot_interval > 0 else None

    # ------------------------------------------------------------------ queries
    @property
    def num_slots(self) -> int:
        """Device slots for requests (dummies excluded)."""
        return self.slot_pool.total - self.slot_pool.permanent

    @property
    def num_pages(self) -> int:
        return self.page_pool.total

    def entry(self, req_id: Hashable) -> Entry:
        e = self._entries.get(req_id)
        if e is None:
            if req_id in self._freed:
                raise DoubleFreeError(f"request {req_id!r} was already freed")
            raise UnknownRequestError(f"unknown request {req_id!r}")
        return e

    def status(self, req_id: Hashable) -> Status:
        return self.entry(req_id).status

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def requests(self) -> list[Hashable]:
        return list(self._entries)

    @property
    def free_dummy_slots(self) -> list[int]:
        return list(self._free_dummy_slots)

    def check_integrity(self) -> None:
        """Raise IntegrityError unless every slot and page has at most one owner and, per tier,
        free + owned + permanent == total."""
        if self._moving is not None:
            raise IntegrityError("a move was left half done")
        check_integrity(self)

    def live_pages(self, e: Entry) -> int:
        """Pages holding the request's committed tokens (none when the model has no page roles)."""
        return pages_for(e.num_tokens, self.page_size) if self.has_pages else 0

    def pages_needed(self, req_id: Hashable, num_new: int) -> int:
        """Pages the request must still take to hold `num_new` more tokens."""
        e = self.entry(req_id)
        if e.status == Status.DUMMY or not self.has_pages:
            return 0
        return max(0, pages_for(e.num_tokens + num_new, self.page_size) - len(e.pages))

    def live_counts(self) -> tuple[int, int]:
        """(requests on the device, device pages held by requests, suspended ones' shared pages included):
        what a rebalance must place."""
        live = [e for e in self._entries.values() if e.on_device]
        return len(live), len({p for e in self._entries.values() if e.status != Status.DUMMY for p in e.pages})

    def kept_pages(self, e: Entry) -> int:
        """How many of a generating request's first pages are shared (another holder: the prefix index or a
        request): suspending it keeps its references to those on the device and copies only the rest."""
        k, live = 0, self.live_pages(e)
        while k < live and self.page_pool.refcount(e.pages[k]) > 1:
            k += 1
        return k


    # ------------------------------------------------------------------ internals
    def _room(self, pages: int) -> bool:
        """Whether `pages` pages are free, evicting cached ones only the prefix index holds if that makes room."""
        short = pages - self.page_pool.num_free
        self.short_pages = max(short, 0)  # what the last check lacked before any eviction (the manager spills it)
        return short <= 0 or (self.prefix is not None and self.prefix.reclaim_pages(short))

    def make_host_room(self, slots: int, pages: int) -> bool:  # `spill.Spill` drops spilled prefix entries
        return self.host_slot_pool.num_free >= slots and self.host_page_pool.num_free >= pages

    def _require_idle(self) -> None:
        if self.prefix is not None and self.prefix.saving is not None:
            raise InvalidTransitionError("a snapshot save is in progress; commit or cancel it first")
        if self.pending is not None:
            raise InvalidTransitionError("a planned step is pending; commit or abort it first")
        if self._moving is not None:
            raise InvalidTransitionError("a move is in progress; commit or cancel it first")

    def _require_settled(self) -> None:
        """What reads a request's committed length (a move, a re-prefill, a new split) waits for `settle`."""
        if self.unsettled:
            raise InvalidTransitionError("a verify step's counts are not settled yet; settle it first")

    def _require_pending(self, plan: StepPlan) -> None:
        if self.pending is None or plan is not self.pending:
            raise InvalidTransitionError("that step is not the pending one")

    def _require_moving(self, plan: MovePlan | RecarvePlan) -> None:
        if self._moving is None or plan is not self._moving:
            raise InvalidTransitionError("that move is not the one in progress")

    def _distinct(self, req_ids: Iterable[Hashable]) -> list[Entry]:
        req_ids = list(req_ids)
        if len(set(req_ids)) != len(req_ids):
            raise ValueError("a request is listed twice")
        return [self.entry(r) for r in req_ids]

    def _growth(self, held: np.ndarray, cached: np.ndarray, n: np.ndarray, dummy: np.ndarray) -> np.ndarray:
        """[B] int64: pages each row must take for `n` more tokens, holding `held` pages for `cached` tokens."""
        if not self.has_pages:
            return np.zeros(len(n), dtype=np.int64)
        grow = np.maximum(pages_for(cached + n, self.page_size) - held, 0)
        grow[dummy] = 0
        return grow

    def _take_pages(self, entries: list[Entry], grow: np.ndarray) -> bool:
        """Extend entry `i`'s pages by `grow[i]` new ones, in row order; whether any were taken."""
        rows = grow.nonzero()[0]
        if rows.size == 0:
            return False
        ids = self.page_pool.allocate(int(grow.sum()))  # the same ids, row by row, as one call per row
        at = 0
        for i, g in zip(rows.tolist(), grow[rows].tolist()):
            entries[i].pages.extend(ids[at : at + g])
            at += g
        return True

    def _release(self, e: Entry) -> None:
        if self.prefix is not None:
            self.prefix.released(e)
        if e.slot >= 0:
            self.slot_pool.release([e.slot])
        self.page_pool.release(e.pages)
        if e.host_slot >= 0:
            self.host_slot_pool.release([e.host_slot])
        self.host_page_pool.release(e.host_pages)
        e.slot, e.pages, e.host_slot, e.host_pages, e.fresh = -1, [], -1, [], False
        self._layout = None


