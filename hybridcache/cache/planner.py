"""`Planner`: the tensor-free half of the cache. Ids, entries, the lifecycle, and the decisions.

It owns the id pools of both tiers and every request's entry; it never touches a tensor. Each call
either completes or raises having changed nothing. Operations that move bytes are two-phase: `plan_*`
reserves ids and returns a plan, the store copies, then `commit_*` (or `cancel_*`) finishes.
"""
from __future__ import annotations

from typing import Hashable, Iterable, Sequence

import numpy as np

from .entries import Entry, Status, TokenCounts, pages_for
from .errors import (
    DoubleFreeError,
    DuplicateRequestError,
    HostTierFullError,
    IntegrityError,
    InvalidCountError,
    InvalidTransitionError,
    OutOfDeviceMemoryError,
    UnknownRequestError,
)
from .counts import MAX_TOKENS, int_array, token_counts
from .id_pool import IdPool
from .integrity import check_integrity
from .layout import Layout
from .plans import AcceptPlan, MovePlan, RecarvePlan, SnapshotPlan, StepPlan, frozen
from .prefix_cache import PrefixCache, PrefixMatch

FREED_REMEMBERED = 4096  # freed ids kept to tell a double free from an unknown id


class Planner:
    """Slots and pages of both tiers, and what each request holds.

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

    # ------------------------------------------------------------------ lifecycle
    def add(self, req_id: Hashable) -> None:
        """Register a request; it holds nothing until it is allocated."""
        if req_id in self._entries:
            raise DuplicateRequestError(f"request {req_id!r} already exists")
        self._freed.pop(req_id, None)
        self._entries[req_id] = Entry(req_id, Status.WAITING, self._tokens, self._tokens.take())

    def add_dummy(self, req_id: Hashable) -> int:
        """Register a padding request on a permanent slot; returns the slot."""
        if req_id in self._entries:
            raise DuplicateRequestError(f"request {req_id!r} already exists")
        if not self._free_dummy_slots:
            raise OutOfDeviceMemoryError(f"all {self.num_dummies} dummy slots are taken")
        slot = self._free_dummy_slots.pop()
        self._freed.pop(req_id, None)
        self._entries[req_id] = Entry(req_id, Status.DUMMY, self._tokens, self._tokens.take(), slot=slot)
        return slot

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

    def match_prefix(self, req_id: Hashable, tokens: Sequence[int], context_len: int) -> PrefixMatch:
        """The longest cached prefix a WAITING request's first `context_len` tokens can start from (see
        `prefix_cache.PrefixCache.match`); pass it to `allocate`. Prefix caching must be on."""
        self._require_idle()
        e = self.entry(req_id)
        if self.prefix is None:
            raise InvalidTransitionError("prefix caching is off")
        if e.status != Status.WAITING:
            raise InvalidTransitionError(f"request {req_id!r} is {e.status.name}, not WAITING")
        if not 0 < context_len <= len(tokens):
            raise InvalidCountError(f"context of {context_len} tokens out of {len(tokens)}")
        return self.prefix.match(e, tokens, context_len)

    def next_keep(self, req_id: Hashable) -> int | None:
        """The next token count past the committed ones where the request saves a snapshot (None: none):
        a keep while in CONTEXT, the next interval boundary while generating (a verify step must not
        commit past it, or that boundary's state is never saved)."""
        e = self.entry(req_id)
        if self.prefix is not None and e.status == Status.GENERATION:
            return (e.num_tokens // self.prefix.interval + 1) * self.prefix.interval
        return next((b for b in e.keeps if b > e.num_tokens), None)

    def plan_snapshots(self, tokens_of) -> SnapshotPlan | None:
        """After a committed step: the snapshots to save (rows that reached a boundary they keep); the
        store copies them, then `commit_snapshots` (or `cancel_snapshots`). `tokens_of(req_id)` gives a
        request's tokens, at least through its committed ones."""
        self._require_idle()
        return self.prefix.plan_save(tokens_of) if self.prefix is not None else None

    def commit_snapshots(self, plan: SnapshotPlan) -> None:
        self.prefix.commit_save(plan)

    def cancel_snapshots(self, plan: SnapshotPlan) -> None:
        self.prefix.cancel_save(plan)

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
        writes = layout.take_writes()
        fresh = layout.take_fresh()
        restore, restore_ids = self._take_restores(layout) if self.prefix is not None else ((), ())
        self._layout = layout
        self.pending = StepPlan(
            req_ids=key, version=layout.version, slots=layout.slots, generation=layout.generation,
            cached_lens=frozen(cached), num_new=frozen(n), fresh=fresh, table_width=layout.width,
            table_writes=writes, dummy=layout.dummy, **({"restore": restore, "restore_ids": restore_ids} if restore_ids else {}),
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
            self.prefix.after_commit(self._layout.entries, self._tokens.counts[self._layout.handles], commit)

    def abort_step(self, plan: StepPlan) -> list[Hashable]:
        """A step failed after it may have written its rows: every request in it drops what it holds and
        restarts from its tokens (re-prefill). Returns those requests; dummies keep their slots (the
        store zeroes them)."""
        self._require_pending(plan)
        self.pending = None
        if self.prefix is not None:
            self.prefix.snap_pool.release(list(plan.restore_ids))
        dropped = []
        for rid, dummy in zip(plan.req_ids, plan.dummy):
            e = self._entries.get(rid)
            if e is None or dummy or e.status == Status.WAITING:
                continue
            self._release(e)
            e.status, e.num_tokens = Status.WAITING, 0
            dropped.append(rid)
        self.stats["aborted_rows"] += len(dropped)
        self._layout = None
        return dropped

    def start_generation(self, req_id: Hashable) -> None:
        """The context is fully prefilled: later steps are decode / verify steps."""
        e = self.entry(req_id)
        if e.status != Status.CONTEXT:
            raise InvalidTransitionError(f"request {req_id!r} is {e.status.name}, not CONTEXT")
        self._require_idle()
        e.status = Status.GENERATION
        if self.prefix is not None:
            self.prefix.left_context(e)
        self._layout = None

    def reprefill(self, req_id: Hashable) -> None:
        """Drop everything the request holds (either tier); its next step starts its context from zero."""
        self._require_idle()
        e = self.entry(req_id)
        if e.status in (Status.WAITING, Status.DUMMY):
            raise InvalidTransitionError(f"request {req_id!r} is {e.status.name}; nothing to re-prefill")
        self._release(e)
        e.status, e.num_tokens = Status.WAITING, 0
        self.stats["reprefills"] += 1

    def free(self, req_id: Hashable) -> None:
        """Forget the request and release everything it holds, in every tier."""
        self._require_idle()
        e = self.entry(req_id)
        if e.status == Status.DUMMY:
            self._free_dummy_slots.append(e.slot)
        else:
            self._release(e)
        del self._entries[req_id]
        self._tokens.give_back(e.handle)
        self._freed[req_id] = None
        if len(self._freed) > FREED_REMEMBERED:
            del self._freed[next(iter(self._freed))]
        e.status = Status.FINISHED
        self._layout = None

    # ------------------------------------------------------------------ moves between tiers
    def plan_suspend(self, req_ids: Sequence[Hashable]) -> MovePlan:
        """Reserve host ids for generating requests' live bytes. Raises HostTierFullError (changing
        nothing) when the host tier cannot hold them all."""
        self._require_idle()
        entries = self._distinct(req_ids)
        for e in entries:
            if e.status != Status.GENERATION:
                what = "a dummy; dummies are never suspended" if e.status == Status.DUMMY else e.status.name
                raise InvalidTransitionError(f"request {e.req_id!r} is {what}; only GENERATION can suspend")
        live = [e.pages[self.kept_pages(e) : self.live_pages(e)] for e in entries]  # shared pages stay
        need = sum(map(len, live))
        hs, hp = self.host_slot_pool, self.host_page_pool
        if len(entries) > hs.num_free or need > hp.num_free:
            raise HostTierFullError(
                f"host tier has {hs.num_free} slots and {hp.num_free} pages free; suspending needs {len(entries)} and {need}"
            )
        plan = MovePlan(
            req_ids=tuple(e.req_id for e in entries), to_host=True, slots=tuple(e.slot for e in entries),
            host_slots=tuple(hs.allocate(len(entries))), pages=tuple(p for ps in live for p in ps),
            host_pages=tuple(hp.allocate(need)), page_counts=tuple(map(len, live)),
        )
        self._moving = plan
        return plan

    def plan_resume(self, req_ids: Sequence[Hashable]) -> MovePlan:
        """Reserve device slots and pages for suspended requests. Raises OutOfDeviceMemoryError (changing
        nothing) when the device has too little free."""
        self._require_idle()
        entries = self._distinct(req_ids)
        for e in entries:
            if e.status != Status.SUSPENDED:
                raise InvalidTransitionError(f"request {e.req_id!r} is {e.status.name}, not SUSPENDED")
        need = sum(len(e.host_pages) for e in entries)
        if len(entries) > self.slot_pool.num_free or not self._room(need):
            raise OutOfDeviceMemoryError(
                f"resume needs {len(entries)} slots and {need} pages; "
                f"{self.slot_pool.num_free} and {self.page_pool.num_free} are free"
            )
        plan = MovePlan(
            req_ids=tuple(e.req_id for e in entries), to_host=False, slots=tuple(self.slot_pool.allocate(len(entries))),
            host_slots=tuple(e.host_slot for e in entries), pages=tuple(self.page_pool.allocate(need)),
            host_pages=tuple(p for e in entries for p in e.host_pages),
            page_counts=tuple(len(e.host_pages) for e in entries),
        )
        self._moving = plan
        return plan

    def commit_move(self, plan: MovePlan, nbytes: int) -> None:
        """The copies are done: the requests now live in the destination tier; the source ids are freed."""
        self._require_moving(plan)
        entries = [self._entries[r] for r in plan.req_ids]
        pages = _split(plan.pages, plan.page_counts)
        host_pages = _split(plan.host_pages, plan.page_counts)
        for e, s, hs, ps, hps in zip(entries, plan.slots, plan.host_slots, pages, host_pages):
            if plan.to_host:  # it keeps its shared pages (the first live - copied ones) on the device
                kept = self.live_pages(e) - len(hps)
                self.slot_pool.release([e.slot])
                self.page_pool.release(e.pages[kept:])
                e.slot, e.pages, e.host_slot, e.host_pages, e.status = -1, e.pages[:kept], hs, hps, Status.SUSPENDED
            else:
                self.host_slot_pool.release([e.host_slot])
                self.host_page_pool.release(e.host_pages)
                e.slot, e.pages, e.host_slot, e.host_pages, e.status = s, e.pages + ps, -1, [], Status.GENERATION
        key = ("suspensions", "bytes_to_host") if plan.to_host else ("resumes", "bytes_to_device")
        self.stats[key[0]] += len(entries)
        self.stats[key[1]] += nbytes
        self._moving = None
        self._layout = None

    def cancel_move(self, plan: MovePlan) -> None:
        """The copies failed: release the reserved destination ids; the source is untouched."""
        self._require_moving(plan)
        dst_slots, dst_pages = (self.host_slot_pool, self.host_page_pool) if plan.to_host else (self.slot_pool, self.page_pool)
        dst_slots.release(list(plan.host_slots if plan.to_host else plan.slots))
        dst_pages.release(list(plan.host_pages if plan.to_host else plan.pages))
        self._moving = None

    def plan_adopt(self, req_id: Hashable, num_tokens: int) -> MovePlan:
        """Reserve a host slot and the host pages of `num_tokens` committed tokens for a request whose live
        bytes come from another engine (disaggregated prefill); the store writes them, then `commit_adopt`
        registers the request SUSPENDED (or `cancel_move` releases the ids). Raises DuplicateRequestError,
        InvalidCountError or HostTierFullError, changing nothing."""
        self._require_idle()
        if req_id in self._entries:
            raise DuplicateRequestError(f"request {req_id!r} already exists")
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not 0 < num_tokens <= MAX_TOKENS:
            raise InvalidCountError(f"an adopted request holds 1..{MAX_TOKENS} tokens, got {num_tokens!r}")
        need = pages_for(num_tokens, self.page_size) if self.has_pages else 0
        hs, hp = self.host_slot_pool, self.host_page_pool
        if hs.num_free < 1 or need > hp.num_free:
            raise HostTierFullError(f"host tier has {hs.num_free} slots and {hp.num_free} pages free; adopting needs 1 and {need}")
        plan = MovePlan(req_ids=(req_id,), to_host=True, slots=(), host_slots=tuple(hs.allocate(1)), pages=(),
                        host_pages=tuple(hp.allocate(need)), page_counts=(need,))
        self._moving = plan
        return plan

    def commit_adopt(self, plan: MovePlan, num_tokens: int) -> None:
        """The adopted request's bytes are in its host records: it is SUSPENDED with `num_tokens` committed."""
        self._require_moving(plan)
        (req_id,) = plan.req_ids
        self._freed.pop(req_id, None)
        e = Entry(req_id, Status.SUSPENDED, self._tokens, self._tokens.take(), host_slot=plan.host_slots[0],
                  host_pages=list(plan.host_pages))
        e.num_tokens = num_tokens
        self._entries[req_id] = e
        self._moving = None

    # ------------------------------------------------------------------ rebalance
    def plan_rebalance(self, num_slots: int, num_pages: int) -> RecarvePlan:
        """Where every live request's slot and pages go in a carving of `num_slots` request slots and
        `num_pages` pages, compacted from row 0. A request keeps as many pages as it holds (what it was
        allocated is its own); only those holding committed tokens are copied. Raises
        OutOfDeviceMemoryError when they do not fit."""
        self._require_idle()
        live = [e for e in self._entries.values() if e.on_device]
        _, held = self.live_counts()
        if num_slots < 1 or len(live) > num_slots or held > num_pages:
            raise OutOfDeviceMemoryError(
                f"{len(live)} live requests holding {held} pages do not fit {num_slots} slots and {num_pages} pages"
            )
        fixed_rows, extra = [], []
        if self.prefix is not None:  # cached pages move too, as far as they fit; held snapshot rows move in place
            if held + len(self.prefix.index_only_pages()) > num_pages:
                self.prefix.drop_all_unpinned()  # pinned chains are held by their requests: none is left over
            extra = self.prefix.index_only_pages()
            fixed_rows = [self.prefix.row(i) for i in self.prefix.snap_pool.owned_ids()]
        extra = self._suspended_pages(live) + extra  # suspended requests' shared pages move too
        plan = RecarvePlan.compacting(
            (self.slot_pool.total, self.page_pool.total), num_slots, num_pages, self.num_dummies,
            [e.slot for e in live], [e.pages for e in live], [self.live_pages(e) for e in live],
            num_fixed=self.num_fixed, fixed_rows=fixed_rows, extra_pages=extra,
        )
        self._moving = plan
        return plan

    def commit_rebalance(self, plan: RecarvePlan) -> None:
        """The store moved the live rows: swap in the new pools and the requests' new ids."""
        self._require_moving(plan)
        live = [e for e in self._entries.values() if e.on_device]
        slot_pool = IdPool(plan.new_slots, permanent=plan.fixed)
        page_pool = IdPool(plan.new_pages)
        slots = slot_pool.allocate(len(live))
        new_id: dict[int, int] = {}
        for e in live:  # the order RecarvePlan.compacting numbered the distinct pages in
            for p in e.pages:
                new_id.setdefault(p, len(new_id))
        for p in self._suspended_pages(live):
            new_id.setdefault(p, len(new_id))
        nodes = list(self.prefix.index.nodes.values()) if self.prefix is not None else []
        for n in nodes:
            if n.page >= 0:
                new_id.setdefault(n.page, len(new_id))
        page_pool.allocate(len(new_id))
        for e, slot in zip(live, slots):
            e.slot, e.pages = slot, [new_id[p] for p in e.pages]
            page_pool.share(e.pages)
        for e in self._entries.values():
            if e.status == Status.SUSPENDED:
                e.pages = [new_id[p] for p in e.pages]
                page_pool.share(e.pages)
        for n in nodes:
            if n.page >= 0:
                n.page = new_id[n.page]
                page_pool.share([n.page])
        page_pool.release(list(range(len(new_id))))  # the allocation's own reference: holders remain
        self.slot_pool, self.page_pool = slot_pool, page_pool
        self.stats["rebalances"] += 1
        self._moving = None
        self._layout = None

    def cancel_rebalance(self, plan: RecarvePlan, state_lost: bool) -> list[Hashable]:
        """The store could not finish. Without `state_lost` it restored the old carving and nothing
        changed; with it, every live request restarts from its tokens (returned)."""
        self._require_moving(plan)
        self._moving = None
        if not state_lost:
            return []
        dropped = []
        for e in self._entries.values():  # a suspended request's shared pages were on the device too
            if e.on_device or (e.status == Status.SUSPENDED and e.pages):
                self._release(e)
                e.status, e.num_tokens = Status.WAITING, 0
                dropped.append(e.req_id)
        self.slot_pool = IdPool(plan.old_slots, permanent=plan.fixed)
        self.page_pool = IdPool(plan.old_pages)
        if self.prefix is not None:  # the device lost every row: the index and its snapshots go
            self.prefix.index.nodes.clear()
            self.prefix.snap_pool = IdPool(self.prefix.snap_pool.total)
        self.stats["aborted_rows"] += len(dropped)
        self._layout = None
        return dropped

    # ------------------------------------------------------------------ internals
    def _suspended_pages(self, live: list[Entry]) -> list[int]:
        """The device pages suspended requests keep (always full) that no live request holds, in entry order."""
        held = {p for e in live for p in e.pages}
        out: dict[int, None] = {}
        for e in self._entries.values():
            if e.status == Status.SUSPENDED:
                out.update((p, None) for p in e.pages if p not in held)
        return list(out)

    def _room(self, pages: int) -> bool:
        """Whether `pages` pages are free, evicting cached ones only the prefix index holds if that makes room."""
        short = pages - self.page_pool.num_free
        return short <= 0 or (self.prefix is not None and self.prefix.reclaim_pages(short))

    def _require_idle(self) -> None:
        if self.prefix is not None and self.prefix.saving is not None:
            raise InvalidTransitionError("a snapshot save is in progress; commit or cancel it first")
        if self.pending is not None:
            raise InvalidTransitionError("a planned step is pending; commit or abort it first")
        if self._moving is not None:
            raise InvalidTransitionError("a move is in progress; commit or cancel it first")

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
        rows = np.flatnonzero(grow)
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


def _split(flat: tuple[int, ...], counts: tuple[int, ...]) -> list[list[int]]:
    out, i = [], 0
    for n in counts:
        out.append(list(flat[i : i + n]))
        i += n
    return out
