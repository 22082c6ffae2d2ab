"""Plans: what the planner decided, as plain data (numpy and tuples, no tensors) that a store executes.

A plan can be pickled, broadcast to tensor-parallel ranks or shipped to another engine; every store that
executes the same plans in the same order holds the same bytes in the same rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable

import numpy as np

if TYPE_CHECKING:  # one exception: `Planner.device_accept` keeps its counts on the device (applied locally, never sent)
    import torch


def frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


_NONE = frozen(np.zeros(0, dtype=np.int64))


@dataclass(frozen=True)
class StepPlan:
    """One forward over `B` rows (a row is a request, or a dummy for padding).

    version      layout of the rows; the store rebuilds its persistent index tensors when it changes
    slots        [B] int64 each row's slot
    generation   [B] bool  decode / verify rows (their acceptance is recorded)
    cached_lens  [B] int64 tokens committed before this step
    num_new      [B] int64 tokens this step feeds per row
    fresh        [B] bool  rows that start from a zero state (their slots are zeroed first)
    table_width  columns of the page table
    table_writes (rows, cols, pages) int64: page-table entries to write (every entry when `version` is new)
    restore      (slots, rows) int64 [r]: rows that start from a prefix-cache snapshot: every role of
                 `slots[i]` is zeroed, then the snapshot in slot row `rows[i]` is copied in (not `fresh`:
                 they start from that state); `restore_ids` the snapshot ids, pinned until commit or abort
    page_copies  (src, dst) int64 [c]: pages to copy before the forward (a partial prefix-cache page into
                 the page of the request that continues it); the `src` pages are pinned until commit or abort
    lens_on_device  the rows' committed lengths are known on the device only (a verify step before them is
                 committed unsettled, `Planner.commit_unsettled`): `cached_lens` is an upper bound, and the
                 store takes the lengths from the step before's on the device plus its accepted counts
    """

    req_ids: tuple[Hashable, ...]
    version: int
    slots: np.ndarray
    generation: np.ndarray
    cached_lens: np.ndarray
    num_new: np.ndarray
    fresh: np.ndarray
    table_width: int
    table_writes: tuple[np.ndarray, np.ndarray, np.ndarray]
    dummy: np.ndarray  # [B] bool
    restore: tuple[np.ndarray, np.ndarray] = field(default_factory=lambda: (_NONE, _NONE))
    restore_ids: tuple[int, ...] = ()
    page_copies: tuple[np.ndarray, np.ndarray] = field(default_factory=lambda: (_NONE, _NONE))
    lens_on_device: bool = False

    @property
    def batch_size(self) -> int:
        return len(self.req_ids)

    @property
    def zero_slots(self) -> np.ndarray:
        return self.slots[self.fresh]

    @property
    def gen_rows(self) -> np.ndarray:
        return self.generation.nonzero()[0]  # flatnonzero's wrapper costs 2 us more a call (1-D here)


@dataclass(frozen=True)
class AcceptPlan:
    """The verify rows' bookkeeping after a step: slots `[n]`, tokens fed `[n]`, tokens now valid `[n]` (a
    device tensor when the store applies it before the counts are read, `Planner.device_accept`)."""

    slots: np.ndarray
    num_tokens: np.ndarray
    num_valid: np.ndarray | torch.Tensor


@dataclass(frozen=True)
class MovePlan:
    """Live bytes to copy between the tiers: device `slots[i]` <-> host `host_slots[i]`, device
    `pages[j]` <-> host `host_pages[j]` (`to_host`: suspend; otherwise resume)."""

    req_ids: tuple[Hashable, ...]
    to_host: bool
    slots: tuple[int, ...]
    host_slots: tuple[int, ...]
    pages: tuple[int, ...]
    host_pages: tuple[int, ...]
    page_counts: tuple[int, ...]  # pages per request, in `req_ids` order
    snapshot: bool = False  # prefix-cache entries: `slots` are snapshot rows, only the snapshot roles move


@dataclass(frozen=True)
class SnapshotPlan:
    """Recurrent snapshots to save after a committed step: the committed state of request slot
    `slots[i]` (replay history folded in) goes to snapshot slot row `rows[i]`, the state after
    `boundaries[i]` tokens of `req_ids[i]` (snapshot ids `ids[i]`, reserved until commit or cancel).
    `page_copies` (src, dst): a partial last page of a request that goes on, copied into a page reserved for
    the index (the request keeps writing its own)."""

    req_ids: tuple[Hashable, ...]
    boundaries: tuple[int, ...]
    slots: tuple[int, ...]
    rows: tuple[int, ...]
    ids: tuple[int, ...]
    page_copies: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())


@dataclass(frozen=True)
class RecarvePlan:
    """Re-carve the device arena from (`old_slots`, `old_pages`) rows to (`new_slots`, `new_pages`); live
    rows move from `slots_from[i]` to `slots_to[i]` and pages from `pages_from[j]` to `pages_to[j]`.
    Counts include the `num_fixed` rows at the bottom that keep their ids: the dummy slots (zeroed) and
    the prefix-cache snapshot rows above them (held ones move like live rows, to the same id)."""

    old_slots: int
    old_pages: int
    new_slots: int
    new_pages: int
    num_dummies: int
    slots_from: tuple[int, ...]
    slots_to: tuple[int, ...]
    pages_from: tuple[int, ...]
    pages_to: tuple[int, ...]
    num_fixed: int = -1  # -1: num_dummies

    @property
    def fixed(self) -> int:
        return self.num_dummies if self.num_fixed < 0 else self.num_fixed

    @classmethod
    def compacting(cls, old: tuple[int, int], num_slots: int, num_pages: int, num_dummies: int,
                   slots: list[int], pages: list[list[int]], committed: list[int], num_fixed: int = -1,
                   fixed_rows: list[int] = (), extra_pages: list[int] = ()) -> "RecarvePlan":
        """Live requests (their slot, the pages they hold, how many of those hold committed tokens) packed
        from row `num_fixed` of a carving of `num_slots` request slots and `num_pages` pages; held fixed
        rows keep their ids. Each distinct page gets the next new id in order (a request's private pages
        are one run: a fresh pool hands them out in this order); a page shared by several holders moves
        once. `extra_pages` (held by the prefix index, always full) follow and are copied."""
        fixed = num_dummies if num_fixed < 0 else num_fixed
        new_id: dict[int, int] = {}
        copy: dict[int, None] = {}
        for ps, k in zip(pages, committed):
            for j, p in enumerate(ps):
                new_id.setdefault(p, len(new_id))
                if j < k:
                    copy[p] = None
        for p in extra_pages:
            new_id.setdefault(p, len(new_id))
            copy[p] = None
        moved = [p for p in new_id if p in copy]
        return cls(
            old_slots=old[0], old_pages=old[1], new_slots=num_slots + fixed, new_pages=num_pages,
            num_dummies=num_dummies, slots_from=tuple(fixed_rows) + tuple(slots),
            slots_to=tuple(fixed_rows) + tuple(range(fixed, fixed + len(slots))),
            pages_from=tuple(moved), pages_to=tuple(new_id[p] for p in moved), num_fixed=fixed,
        )
