"""`PrefixCache`: the planner's prefix caching of attention pages and recurrent snapshots. Tensor-free.

Snapshots are slot rows of the same arena (every role), above the dummy slots; the index names them by
id (`row = num_dummies + id`). A request is admitted at the longest cached prefix whose pages and
snapshot meet at one boundary: it shares those pages by reference, and its first step zeroes its slot and
copies the snapshot in. Snapshots are saved after a committed step, at boundaries that are multiples of
`interval` (a multiple of the page size) and only where one will be kept:

- the branch point: where the request's prompt leaves the longest chain of full pages that the index or
  a request still prefilling (in flight) holds, rounded down to the interval. When an in-flight request
  has not reached that point yet, it is asked to save there and the newcomer waits (`defer`): the second
  request of a group sent at once then starts from the first one's snapshot instead of from zero;
- the prompt's last interval boundary;
- every interval boundary a generating request's commit lands on (its latest one is kept), so a
  conversation's next turn starts from where the last one ended, generated tokens included.

A snapshot id is pinned (reference count 2) from admission until the step that restores it commits or
aborts. Unpinned snapshots, and the pages only the index holds, are evicted least recently used when the
allocator needs room, and never otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Hashable, Sequence

import numpy as np

from .entries import Entry, Status
from .errors import InvalidTransitionError
from .id_pool import IdPool
from .plans import SnapshotPlan
from .prefix_eviction import LIVE_GEN_RANK, PrefixEviction, kind_rank
from .prefix_index import BRANCH, GEN, PROMPT, ROOT, Node, PrefixIndex, chain_hashes, partial_hash

if TYPE_CHECKING:
    from .planner import Planner


@dataclass(frozen=True)
class PrefixMatch:
    """What admission would give a waiting request: `tokens` cached (below its context length; a page
    boundary, or a partial node's end), the `nodes` of those pages (a partial node last, whose page is copied),
    the `snapshot` id to restore (-1 on a miss), the boundaries it should save at, and whether it should
    wait for an in-flight request (`defer`)."""

    req_id: Hashable
    tokens: int
    nodes: tuple[Node, ...]
    snapshot: int
    keeps: tuple[int, ...]
    context_len: int
    defer: bool = False
    leader: Hashable | None = None  # with `defer`: the in-flight request asked to save at `branch`
    branch: int = 0
    unspill: bool = False  # the snapshot or some of the pages are in the host tier: `Planner.plan_unspill` first


    @property
    def shared_pages(self) -> list[int]:
        """The device pages admission shares (a partial node's page is copied instead)."""
        return [n.page for n in self.nodes if n.page >= 0 and not n.fill]


class PrefixCache(PrefixEviction):
    def __init__(self, planner: "Planner", num_snapshots: int, interval: int) -> None:
        if interval < 1 or interval % planner.page_size:
            raise ValueError(f"snapshot interval {interval} is not a multiple of the page size {planner.page_size}")
        self.planner = planner
        self.interval = interval
        self.index = PrefixIndex()
        self.snap_pool = IdPool(num_snapshots)
        self.inflight: dict[bytes, Entry] = {}  # a prompt page hash -> a CONTEXT request computing it
        self.candidates: list[tuple[Entry, int]] = []  # committed at a boundary it keeps, since the last save
        self.saving: SnapshotPlan | None = None
        self._partial_keys: dict[tuple[Hashable, int], bytes] = {}  # the saving plan's partial nodes
        self._partial_pages: dict[tuple[Hashable, int], int] = {}  # and the pages reserved for their copies
        self.protected: set[int] = set()  # ids of nodes no eviction may take now (a match coming back)
        self.spilling: tuple | None = None  # the nodes of the spill or unspill in progress (`planner/spill.py`)
        self.stats = {"queries": 0, "hits": 0, "evictions": 0, "snapshots_saved": 0, "spills": 0, "host_hits": 0}
        self.allow_drop = True  # False: `reclaim_pages` refuses, so that the manager spills first

    def row(self, snapshot: int) -> int:
        return self.planner.num_dummies + snapshot

    # ------------------------------------------------------------------ admission
    def match(self, e: Entry, tokens: Sequence[int], context_len: int, host_ok: bool = True) -> PrefixMatch:
        """The admission of waiting request `e`, whose first `context_len` of `tokens` are its context (with
        `host_ok`, a snapshot or pages in the host tier count: `unspill` says so).
        Changes nothing but a leader's keep list (asking an in-flight request to save at a branch point)."""
        P, I = self.planner.page_size, self.interval
        hashes = self._hashes(e, tokens, context_len)[: context_len // P]
        nodes = self.index.walk(hashes)
        if not host_ok:
            nodes = nodes[: next((k for k, n in enumerate(nodes) if n.host_page >= 0), len(nodes))]
        usable = (lambda n: n.cached) if host_ok else (lambda n: n.snapshot >= 0 and n.host_page < 0)
        hit_nodes: tuple[Node, ...] = ()
        for k in range(len(nodes), -1, -1):  # deepest first: a partial node below page k, then page k's snapshot
            part = self._partial(nodes[k - 1] if k else None, tokens, k * P, context_len, usable)
            if part is not None:
                hit_nodes = (*nodes[:k], part)
                break
            if k and usable(nodes[k - 1]) and k * P < context_len:
                hit_nodes = tuple(nodes[:k])
                break
        hit = hit_nodes[-1].num_tokens(P) if hit_nodes else 0
        unspill = bool(hit_nodes) and (hit_nodes[-1].snapshot < 0 or any(n.host_page >= 0 for n in hit_nodes))
        d_in = 0
        while d_in < len(hashes) and hashes[d_in] in self.inflight:
            d_in += 1
        branch = max(len(nodes), d_in) * P // I * I
        keeps = tuple(sorted({b for b in (branch, context_len // I * I) if b > hit}))
        defer, leader = False, None
        if d_in * P >= branch > hit:
            leader = self.inflight[hashes[d_in - 1]]
            if leader.status == Status.CONTEXT and leader.num_tokens < branch:
                if branch not in leader.keeps:
                    leader.keeps = tuple(sorted((*leader.keeps, branch)))
                if branch not in leader.branches:
                    leader.branches = (*leader.branches, branch)
                defer = True
        return PrefixMatch(e.req_id, hit, hit_nodes, hit_nodes[-1].snapshot if hit_nodes else -1,
                           keeps, context_len, defer, leader.req_id if defer else None, branch, unspill)

    def _partial(self, parent: Node | None, tokens: Sequence[int], start: int, context_len: int, usable) -> Node | None:
        """The longest usable partial node below `parent` (whose pages end at token `start`) that `tokens`
        continue and that leaves at least one context token to prefill."""
        best = None
        for n in self.index.partials_below(parent):
            end = start + n.fill
            if (end < context_len and usable(n) and (best is None or n.fill > best.fill)
                    and n.key == partial_hash(parent.key if parent is not None else ROOT, tokens[start:end])):
                best = n
        return best

    def admit(self, e: Entry, m: PrefixMatch) -> None:
        """Give waiting `e` the match's pages (a reference each) and pin its snapshot; `undo_admit` reverses."""
        if m.unspill:
            raise InvalidTransitionError("the match holds host-tier entries: bring them back first "
                                         "(HybridCacheManager.unspill)")
        pages = m.shared_pages
        self.page_pool.share(pages)
        if m.snapshot >= 0:
            self.snap_pool.share([m.snapshot])
        if m.nodes and m.nodes[-1].fill and m.nodes[-1].page >= 0:  # pinned until the first step copies it
            e.copy_src = m.nodes[-1].page
            self.page_pool.share([e.copy_src])
        e.pages, e.restore, e.keeps = pages, m.snapshot, m.keeps
        e.branches = (m.branch,) if m.branch in m.keeps else ()
        e.num_tokens = m.tokens

    def undo_admit(self, e: Entry) -> None:
        self.page_pool.release(e.pages)
        if e.restore >= 0:
            self.snap_pool.release([e.restore])
        self._unpin_copy(e)
        e.pages, e.restore, e.keeps, e.branches, e.num_tokens = [], -1, (), (), 0

    def admitted(self, e: Entry, m: PrefixMatch) -> None:
        """The allocation went through: count the query and hit, mark the chain used, and list the
        request's prompt pages as in flight."""
        self.stats["queries"] += m.context_len
        self.stats["hits"] += m.tokens
        t = self.index.tick()
        for n in m.nodes:
            n.last_used = t
        if m.snapshot >= 0:
            node = m.nodes[-1]
            node.hits += 1
            if node.hits > 1 or node.kind == PROMPT:  # another request shares that prompt's prefix
                node.kind = BRANCH
            e.tail_node = node if node.kind == GEN else None
        for h in e.hashes[: m.context_len // self.planner.page_size]:
            self.inflight.setdefault(h, e)

    def _unpin_copy(self, e: Entry) -> None:
        if e.copy_src >= 0:
            self.page_pool.release([e.copy_src])
            e.copy_src = -1

    def left_context(self, e: Entry) -> None:
        """`e` is no longer prefilling (it generates, restarts or is freed)."""
        for h in e.hashes:
            if self.inflight.get(h) is e:
                del self.inflight[h]
        e.keeps, e.branches = (), ()

    def released(self, e: Entry) -> None:
        """`e` dropped what it holds: its pin and in-flight marks go too."""
        if e.restore >= 0:
            self.snap_pool.release([e.restore])
            e.restore = -1
        self._unpin_copy(e)
        self.left_context(e)
        e.tail_node = None

    # ------------------------------------------------------------------ saving snapshots
    def after_commit(self, entries: list[Entry], counts: np.ndarray, committed: np.ndarray) -> None:
        """Rows whose commit reached a boundary they keep: context rows at a keep, generation rows whenever
        they reach or pass an interval boundary (saved where the commit lands: a sampled row's verify step
        may jump the boundary, since its drafts are not cut there, and then lands inside a page)."""
        I = self.interval
        rows = np.flatnonzero((committed > 0) & (counts // I > (counts - committed) // I))
        for i in rows.tolist():
            e, b = entries[i], int(counts[i])
            if e.status == Status.GENERATION or (e.status == Status.CONTEXT and b % I == 0 and b in e.keeps):
                self.candidates.append((e, b, False))

    def add_ends(self, entries: Sequence[Entry]) -> None:
        """Requests that finish now: their committed end is saved too, wherever it falls (a partial last
        page becomes a partial node), so a conversation's next turn starts exactly there."""
        self.candidates += [(e, e.num_tokens, True) for e in entries if e.on_device and e.num_tokens > 0]

    def rows_to_spill_for(self) -> int:
        """Snapshot rows to free by spilling before the candidates are saved: those of the candidates worth
        a host record, beyond the free rows (a live request's latest state only takes a free row, or one
        worth less than it)."""
        worth = sum(1 for c in self.candidates if self._save_rank(*c) > LIVE_GEN_RANK)
        return max(0, worth - self.snap_pool.num_free)

    def plan_save(self, tokens_of: Callable[[Hashable], Sequence[int]]) -> SnapshotPlan | None:
        """Reserve snapshot ids for the candidates (evicting unpinned ones least recently used first);
        None when there is nothing to save."""
        # the most valuable kinds take the free rows first: a save never evicts a snapshot worth more
        cands = sorted(self.candidates, key=lambda c: -self._save_rank(*c))
        self.candidates = []
        P, out, taken, copies = self.planner.page_size, [], set(), ([], [])
        self._partial_keys, self._partial_pages = {}, {}
        for e, b, ending in cands:
            if e.num_tokens != b or not e.on_device or (e.req_id, b) in taken:
                continue
            taken.add((e.req_id, b))
            tokens = tokens_of(e.req_id)
            if len(tokens) < b:  # the caller no longer has the tokens the state holds
                continue
            hashes = self._hashes(e, tokens, b)
            full, fill = divmod(b, P)
            if fill:
                key = partial_hash(hashes[full - 1] if full else ROOT, tokens[full * P : b])
                self._partial_keys[e.req_id, b] = key
            else:
                key = hashes[full - 1]
            node = self.index.nodes.get(key)
            if node is not None and node.cached:
                node.last_used = self.index.tick()
                continue
            # a request that goes on keeps writing its partial page: the index gets a copy (if a page is free)
            own = fill and not ending and self.planner.has_pages
            if own and self.page_pool.num_free == 0:
                continue
            sid = self._free_snapshot(self._save_rank(e, b, ending))
            if sid is None:  # no row now: the next round (`manager.save_snapshots`) tries again
                self.candidates.append((e, b, ending))
                continue
            if own:
                page = self.page_pool.allocate(1)[0]
                self._partial_pages[e.req_id, b] = page
                copies[0].append(e.pages[full])
                copies[1].append(page)
            out.append((e, b, sid))
        if not out:
            return None
        self.saving = SnapshotPlan(tuple(e.req_id for e, _, _ in out), tuple(b for _, b, _ in out),
                                   tuple(e.slot for e, _, _ in out), tuple(self.row(s) for _, _, s in out),
                                   tuple(s for _, _, s in out), (tuple(copies[0]), tuple(copies[1])))
        return self.saving

    def commit_save(self, plan: SnapshotPlan) -> None:
        """The store copied the states: index them (a chain of the request's full pages ending in the snapshot)."""
        assert plan is self.saving, "that snapshot plan is not the one in progress"
        self.saving = None
        P = self.planner.page_size
        for rid, b, sid in zip(plan.req_ids, plan.boundaries, plan.ids):
            e = self.planner.entry(rid)
            full, fill = divmod(b, P)
            pages = e.pages if self.planner.has_pages else None
            node = self._insert(e.hashes[:full], pages[:full] if pages is not None else None)
            if fill:
                key, own = self._partial_keys.pop((rid, b)), self._partial_pages.pop((rid, b), -1)
                if own < 0:  # an ending request's own page: the index shares it
                    node = self._insert_partial(key, node, pages[full] if pages else -1, fill)
                elif key in self.index.nodes:  # two rows of one step saved the same prefix
                    self.page_pool.release([own])
                    node = self.index.nodes[key]
                else:  # the copy's reservation is the index's reference
                    node = self.index.add_partial(key, node, own, fill)
            if node.cached:  # two rows of one step saved the same prefix
                self.snap_pool.release([sid])
                continue
            node.snapshot, node.last_used = sid, self.index.tick()
            node.kind = self._kind_of(e, b)
            self.stats["snapshots_saved"] += 1
            if node.kind != BRANCH:  # a later state of the request replaces its last GEN one (an ancestor)
                old, e.tail_node = e.tail_node, (node if node.kind == GEN else None)
                if (old is not None and old is not node and old.kind == GEN and self.index.nodes.get(old.key) is old
                        and (old.host_snapshot >= 0
                             or old.snapshot >= 0 and self.snap_pool.refcount(old.snapshot) == 1)):
                    self._drop(old, evicted=False)

    def cancel_save(self, plan: SnapshotPlan) -> None:
        assert plan is self.saving, "that snapshot plan is not the one in progress"
        self.saving = None
        self._partial_keys, self._partial_pages = {}, {}
        self.snap_pool.release(list(plan.ids))
        self.page_pool.release(list(plan.page_copies[1]))

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _kind_of(e: Entry, boundary: int) -> str:
        """The kind of the snapshot `e` saves at `boundary` (see `prefix_index.Node.kind`)."""
        return GEN if e.status == Status.GENERATION else BRANCH if boundary in e.branches else PROMPT

    def _save_rank(self, e: Entry, boundary: int, ending: bool) -> int:
        return kind_rank(self._kind_of(e, boundary), live=not ending)

    def _hashes(self, e: Entry, tokens: Sequence[int], upto: int) -> list[bytes]:
        """`e`'s page hashes through token `upto`, extending the ones it has."""
        P = self.planner.page_size
        have = len(e.hashes)
        if upto // P > have:
            e.hashes.extend(chain_hashes(tokens[:upto], P, e.hashes[-1] if have else b"", have))
        return e.hashes

    def _insert_partial(self, key: bytes, parent: Node | None, page: int, fill: int) -> Node:
        """The partial node `key` below `parent`, added over `page` (a reference) when missing."""
        node = self.index.nodes.get(key)
        if node is None:
            if page >= 0:
                self.page_pool.share([page])
            node = self.index.add_partial(key, parent, page, fill)
        return node

    def _insert(self, hashes: list[bytes], pages: list[int] | None) -> Node:
        """The chain for `hashes`, adding the missing nodes over `pages` (a reference each); its last node
        (None for no hashes: the root)."""
        parent = None
        for k, h in enumerate(hashes):
            node = self.index.nodes.get(h)
            if node is None:
                page = pages[k] if pages is not None else -1
                if page >= 0:
                    self.page_pool.share([page])
                node = self.index.add(h, parent, page)
            elif node.host_page >= 0 and pages is not None:  # the request holds the same tokens on the device
                self.page_pool.share([pages[k]])
                self.planner.host_page_pool.release([node.host_page])
                node.page, node.host_page = pages[k], -1
            parent = node
        return parent
