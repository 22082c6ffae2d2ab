"""The prefix cache's moves between the tiers, each a transaction of the planner and the store: spill
(device -> host), unspill (host -> device, for an admitted match) and saving snapshots after a step.
`HybridCacheManager` exposes them; the planner plans and commits, the store copies."""
from __future__ import annotations

import logging
from typing import Callable, Hashable, Sequence

from .errors import OutOfDeviceMemoryError
from .planner import Planner
from .prefix_cache import PrefixMatch
from .store import CacheStore

log = logging.getLogger(__name__)


def spill(planner: Planner, store: CacheStore, pages: int, snapshots: int, protect: tuple) -> int:
    """Move unpinned cached entries (none of `protect`) to the host tier until `pages` device pages and
    `snapshots` snapshot rows are freed, as far as the host tier has room. A failed copy changes nothing
    (logged). Returns the bytes moved."""
    plan = planner.plan_spill(pages, snapshots, protect)
    if plan is None:
        return 0
    try:
        moved = store.copy(plan)
    except Exception:
        planner.cancel_spill(plan)
        log.exception("spilling cached prefix entries failed; nothing moved")
        return 0
    planner.commit_spill(plan)
    return moved


def unspill(planner: Planner, store: CacheStore, match: PrefixMatch, tokens: Sequence[int]) -> PrefixMatch:
    """Bring a match's host-tier pages and snapshot back to the device; returns the match to admit. When
    the device has no room or the copy fails (nothing changed), the match the device alone gives for the
    request's `tokens` (the ones matched; without them no partial page can match)."""
    pc = planner.prefix
    hit = match.nodes[-1]
    pages = sum(1 for n in match.nodes if n.host_page >= 0) - planner.page_pool.num_free
    rows = int(hit.host_snapshot >= 0 and pc.snap_pool.num_free == 0)
    spill(planner, store, pages, rows, tuple(match.nodes))  # room by spilling others, not dropping
    try:
        plan = planner.plan_unspill(match)
    except OutOfDeviceMemoryError:
        return _device_match(planner, match, tokens)
    try:
        store.copy(plan)
    except Exception:
        planner.cancel_spill(plan)
        log.exception("bringing a cached prefix back from the host tier failed; it is prefilled instead")
        return _device_match(planner, match, tokens)
    return planner.commit_unspill(plan, match)


def _device_match(planner: Planner, match: PrefixMatch, tokens: Sequence[int]) -> PrefixMatch:
    e = planner.entry(match.req_id)  # its full pages' hashes are kept; a partial page's need the tokens
    return planner.prefix.match(e, tokens, match.context_len, host_ok=False)


def save_snapshots(planner: Planner, store: CacheStore, tokens_of: Callable[[Hashable], Sequence[int]],
                   ends: Sequence[Hashable]) -> int:
    """After a committed step, save the prefix-cache snapshots its rows reached, and the committed end of
    the requests `ends` (that finish now, before they are freed), in rounds: each spills what the worthy
    candidates need, saves those that found a row — a transaction: a failed copy indexes none of that
    round's — and leaves the rest to the next round, until a round saves nothing (more rows than the pool
    holds may end at once). `tokens_of(req_id)` gives a request's tokens through its committed ones.
    Returns how many were saved."""
    pc = planner.prefix
    if ends:
        planner.save_at_end(ends)
    saved = 0
    try:
        while pc is not None and pc.candidates:
            if pc.rows_to_spill_for():
                spill(planner, store, 0, pc.rows_to_spill_for(), ())
            plan = planner.plan_snapshots(tokens_of)
            if plan is None:
                break
            try:
                store.save_snapshots(plan)
            except BaseException:
                planner.cancel_snapshots(plan)
                raise
            planner.commit_snapshots(plan)
            saved += len(plan.ids)
    finally:
        if pc is not None:
            pc.candidates = []
    return saved
