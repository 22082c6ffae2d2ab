"""The planner's steps: `allocate` (decide and take, or nothing), `plan_step` (the immutable plan the store
executes), then `check_accept` and `commit_step`, or `abort_step` (its rows restart from their tokens)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Hashable, Sequence

import numpy as np

if TYPE_CHECKING:  # one exception: `Planner.device_accept` keeps its counts on the device (applied locally, never sent)
    import torch

from ..entries import Status, pages_for
from ..errors import InvalidCountError, InvalidTransitionError, OutOfDeviceMemoryError
from ..counts import MAX_TOKENS, int_array, token_counts
from ..layout import Layout
from ..plans import AcceptPlan, StepPlan, frozen
from ..prefix_cache import PrefixMatch
from .core import PlannerCore


class Steps(PlannerCore):
    def allocate(self, req_ids: Sequence[Hashable], num_new: Sequence[int] | int,
                 prefix: PrefixMatch | None = None) -> bool:
        """Give each request what it needs for `num_new` more tokens — a zeroed slot for a WAITING one
        (it becomes CONTEXT), the pages past its current ones — or nothing at all and return False.
        `prefix` (from `match_prefix`, for one WAITING request) admits it at the cached prefix: it shares
        those pages, starts from the snapshot, and `num_new` counts the tokens after the prefix. Cached
        pages that only the prefix index holds are evicted when that makes room.

        What is allocated belongs to the request at once, whether or not a step runs it.
        """
        self._require_idle()
        key = tuple(req_ids)
        layout = self._layout
        if layout is not None and layout.key == key:  # the last step's rows again: on the device or dummies
            n = token_counts(num_new, len(key))
            grow = self._growth(layout.held, self._tokens.counts[layout.handles], n, layout.dummy)
            if not self._room(int(grow.sum())):
                return False
            self._take_pages(layout.entries, grow)
            layout.grew(grow)
            return True
        entries = self._distinct(key)
        n = token_counts(num_new, len(entries))
        for e in entries:
            if e.status == Status.SUSPENDED:
                raise InvalidTransitionError(f"request {e.req_id!r} is suspended; resume it first")
        if prefix is not None:
            if self.prefix is None or len(entries) != 1 or entries[0].status != Status.WAITING or prefix.req_id != key[0]:
                raise InvalidTransitionError("a prefix match admits the one WAITING request it was made for")
            if entries[0].num_tokens or entries[0].pages:
                raise InvalidTransitionError(f"request {key[0]!r} already holds state")
            self.prefix.admit(entries[0], prefix)
        fresh = [e for e in entries if e.status == Status.WAITING]
        held = np.array([len(e.pages) for e in entries], dtype=np.int64)
        cached = self._tokens.counts[[e.handle for e in entries]]
        dummy = np.array([e.status == Status.DUMMY for e in entries], dtype=bool)
        grow = self._growth(held, cached, n, dummy)
        if len(fresh) > self.slot_pool.num_free or not self._room(int(grow.sum())):
            if prefix is not None:
                self.prefix.undo_admit(entries[0])
            return False
        for e, slot in zip(fresh, self.slot_pool.allocate(len(fresh))):
            e.slot, e.status, e.fresh = slot, Status.CONTEXT, e.restore < 0
        if prefix is not None:
            self.prefix.admitted(entries[0], prefix)
        if self._take_pages(entries, grow) and layout is not None:
            layout.recount()
        return True

    def plan_step(self, req_ids: Sequence[Hashable], num_new: Sequence[int] | int) -> StepPlan:
        """The step plan of rows already allocated for `num_new` tokens; it stays pending until
        `commit_step` or `abort_step`. Rows that changed since the last plan are the only page-table
        writes when the rows are the same."""
        self._require_idle()
        key = tuple(req_ids)
        layout = self._layout
        if layout is None or layout.key != key:
            entries = self._distinct(key)
            for e in entries:
                if not (e.on_device or e.status == Status.DUMMY):
                    raise InvalidTransitionError(f"request {e.req_id!r} is {e.status.name}: allocate it first")
            self._version += 1
            layout = Layout(key, entries, self._version)
        n = token_counts(num_new, len(key))
        cached = self._tokens.counts[layout.handles]
        if (cached + n > MAX_TOKENS).any():
            raise InvalidCountError(f"a row would pass {MAX_TOKENS} tokens")
        if self.has_pages:
            short = ~layout.dummy & (pages_for(cached + n, self.page_size) > layout.held)
            if short.any():
                i = int(np.flatnonzero(short)[0])
                raise OutOfDeviceMemoryError(f"request {key[i]!r} is not allocated for {n[i]} more tokens")
        on_device = bool(self.unsettled)
        if on_device and key != tuple(e.req_id if e else None for e in self.unsettled[-1][0]) and any(
                e is not None and self._entries.get(e.req_id) is e and e.status == Status.GENERATION
                for e in self.unsettled[-1][0]):
            raise InvalidTransitionError("the rows of an unsettled verify step step together until it is settled")
        writes = layout.take_writes()
        fresh = layout.take_fresh()
        restore, restore_ids = self._take_restores(layout) if self.prefix is not None else ((), ())
        copies = self._take_page_copies(layout) if self.prefix is not None else None
        self._layout = layout
        self.pending = StepPlan(
            req_ids=key, version=layout.version, slots=layout.slots, generation=layout.generation,
            cached_lens=frozen(cached), num_new=frozen(n), fresh=fresh, table_width=layout.width,
            table_writes=writes, dummy=layout.dummy, **({"restore": restore, "restore_ids": restore_ids} if restore_ids else {}),
            **({"page_copies": copies} if copies is not None else {}), lens_on_device=on_device,
        )
        return self.pending

    def _take_restores(self, layout: Layout):
        """(slots, rows) of the rows whose first step restores a snapshot, and the pinned ids (the plan
        now holds the pins until commit or abort)."""
        rows = [e for e in layout.entries if e.restore >= 0]
        if not rows:
            return (), ()
        ids = tuple(e.restore for e in rows)
        for e in rows:
            e.restore = -1
        slots = frozen(np.array([e.slot for e in rows], dtype=np.int64))
        return (slots, frozen(np.array([self.prefix.row(i) for i in ids], dtype=np.int64))), ids

    def _take_page_copies(self, layout: Layout) -> tuple[np.ndarray, np.ndarray] | None:
        """(src, dst) of the rows whose first step continues a partial cached page: the pinned page is
        copied into the row's own page at that position (the plan now holds the pins)."""
        rows = [e for e in layout.entries if e.copy_src >= 0]
        if not rows:
            return None
        src = [e.copy_src for e in rows]
        dst = [e.pages[e.num_tokens // self.page_size] for e in rows]
        for e in rows:
            e.copy_src = -1
        return frozen(np.array(src, dtype=np.int64)), frozen(np.array(dst, dtype=np.int64))

    def check_accept(self, plan: StepPlan, num_valid: Sequence[int] | np.ndarray | None) -> AcceptPlan:
        """Validate a step's acceptance without changing anything: context rows commit all their tokens,
        generation rows `num_valid[i]` in 1..num_new (the fed token plus accepted drafts)."""
        self._require_pending(plan)
        n = plan.num_new
        if num_valid is None:
            valid = n
        else:
            valid = int_array(num_valid, "accept counts")
            if valid.shape != n.shape:
                raise InvalidCountError(f"{n.size} rows but {valid.size} accept counts")
            bad = plan.generation & ((valid < 1) | (valid > n))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise InvalidCountError(f"request {plan.req_ids[i]!r}: {valid[i]} valid tokens of {n[i]}")
        rows = plan.gen_rows
        return AcceptPlan(plan.slots[rows], n[rows], np.where(plan.generation, valid, n)[rows])

    def device_accept(self, plan: StepPlan, num_valid: torch.Tensor) -> AcceptPlan:
        """The pending step's accept plan while its generation rows' counts `[n]` are still on the device
        (the store can apply it before they are read); `check_accept` validates the host counts after,
        and a failure there aborts the step as any other does."""
        self._require_pending(plan)
        rows = plan.gen_rows
        if num_valid.shape != rows.shape:
            raise InvalidCountError(f"{rows.size} generation rows but {tuple(num_valid.shape)} accept counts")
        return AcceptPlan(plan.slots[rows], plan.num_new[rows], num_valid)

    def commit_step(self, plan: StepPlan, accept: AcceptPlan) -> None:
        """The step's tokens are in the cache: context rows all of them, generation rows `accept.num_valid`."""
        self._require_pending(plan)
        commit = plan.num_new.copy()
        commit[plan.gen_rows] = accept.num_valid
        commit[plan.dummy] = 0
        self._tokens.counts[self._layout.handles] += commit
        self.pending = None
        if self.prefix is not None:
            self.prefix.snap_pool.release(list(plan.restore_ids))
            self.page_pool.release(plan.page_copies[0].tolist())
            self.prefix.after_commit(self._layout.entries, self._tokens.counts[self._layout.handles], commit)

    def commit_unsettled(self, plan: StepPlan) -> None:
        """Commit a verify step of generation rows before its counts are read (asynchronous verify): each
        row commits every token it fed, an upper bound, and `settle` later takes its rejected drafts back.
        Until then only these rows step again (their lengths then live on the device: `lens_on_device`)
        and nothing that reads a committed length runs (suspend, resume, re-prefill, rebalance, adopt);
        freeing is fine. Not with prefix caching (its saves need the counts at commit)."""
        self._require_pending(plan)
        if self.prefix is not None:
            raise InvalidTransitionError("an unsettled verify step needs prefix caching off")
        if not plan.generation.all() or plan.dummy.any():
            raise InvalidTransitionError("an unsettled verify step has generation rows only")
        self.commit_step(plan, AcceptPlan(plan.slots, plan.num_new, plan.num_new))
        self.unsettled.append((list(self._layout.entries), plan.num_new.copy()))

    def settle(self, num_valid: Sequence[int] | np.ndarray) -> None:
        """The oldest unsettled step's counts, read back: row i keeps `num_valid[i]` (1..its tokens) of the
        tokens it committed. Rows freed or restarted since keep nothing to take back."""
        self._require_idle()
        if not self.unsettled:
            raise InvalidTransitionError("no verify step is unsettled")
        entries, fed = self.unsettled[0]
        valid = int_array(num_valid, "accept counts")
        if valid.shape != fed.shape or ((valid < 1) | (valid > fed)).any():
            raise InvalidCountError(f"accept counts {valid.tolist()} do not fit the step's {fed.tolist()} tokens")
        self.unsettled.pop(0)
        for e, back in zip(entries, (fed - valid).tolist()):
            if back and e is not None and self._entries.get(e.req_id) is e and e.status == Status.GENERATION:
                e.num_tokens -= back

    def abort_step(self, plan: StepPlan) -> list[Hashable]:
        """A step failed after it may have written its rows: every request in it drops what it holds and
        restarts from its tokens (re-prefill). Returns those requests; dummies keep their slots (the
        store zeroes them)."""
        self._require_pending(plan)
        self.pending = None
        if self.prefix is not None:
            self.prefix.snap_pool.release(list(plan.restore_ids))
            self.page_pool.release(plan.page_copies[0].tolist())
        dropped = []
        for rid, dummy in zip(plan.req_ids, plan.dummy):
            e = self._entries.get(rid)
            if e is None or dummy or e.status == Status.WAITING:
                continue
            self._release(e)
            e.status, e.num_tokens = Status.WAITING, 0
            dropped.append(rid)
        if self.unsettled:  # a restarted row takes nothing back, even once it generates again
            gone = {rid for rid in dropped}
            self.unsettled = [([None if e is not None and e.req_id in gone else e for e in entries], fed)
                              for entries, fed in self.unsettled]
        self.stats["aborted_rows"] += len(dropped)
        self._layout = None
        return dropped
