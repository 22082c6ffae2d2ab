"""The planner's side of prefix caching (`prefix_cache.PrefixCache` holds the index and the snapshot ids):
matching a waiting request against the cache, where a request keeps snapshots, and the two-phase
snapshot save after a committed step."""
from __future__ import annotations

from typing import Hashable, Sequence

from ..entries import Status
from ..errors import InvalidCountError, InvalidTransitionError
from ..plans import SnapshotPlan
from ..prefix_cache import PrefixMatch
from .core import PlannerCore


class PrefixAdmission(PlannerCore):
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

    def save_at_end(self, req_ids: Sequence[Hashable]) -> None:
        """Requests about to finish: the next `plan_snapshots` also saves each one's committed end, even
        inside a page (a partial node), so that a conversation's next turn starts exactly there."""
        self._require_idle()
        if self.prefix is not None:
            self.prefix.add_ends(self._distinct(req_ids))

    def reset_prefix(self) -> None:
        """Drop every cached prefix entry no request uses, on the device and in the host tier (pages a
        request holds stay its own). Prefix caching off: nothing."""
        self._require_idle()
        if self.prefix is not None:
            self.prefix.drop_all_unpinned(host_too=True, evicted=False)

    def commit_snapshots(self, plan: SnapshotPlan) -> None:
        self.prefix.commit_save(plan)

    def cancel_snapshots(self, plan: SnapshotPlan) -> None:
        self.prefix.cancel_save(plan)
