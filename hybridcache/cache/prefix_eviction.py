"""`PrefixEviction`: how the prefix cache gives back room — evicting unpinned snapshots (and the pages only
their chains hold) in an order by the prefill each is likely to save, dropping all of them for a rebalance,
and forgetting everything when the device lost its rows. Tensor-free; a part of `prefix_cache.PrefixCache`,
whose state (index, snapshot ids, pins) it works on.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .id_pool import IdPool
from .prefix_index import BRANCH, GEN, PROMPT, Node, PrefixIndex

if TYPE_CHECKING:
    from .planner import Planner

# how valuable a snapshot is, by kind (higher stays longer; see `PrefixEviction.victim_order`)
SUPERSEDED, PROMPT_RANK, LIVE_GEN_RANK, GEN_RANK, BRANCH_RANK = 0, 1, 2, 3, 4
_KIND_RANK = {PROMPT: PROMPT_RANK, GEN: GEN_RANK, BRANCH: BRANCH_RANK}


def kind_rank(kind: str, live: bool = False) -> int:
    """The rank of a snapshot of `kind` (`live`: the latest GEN one of a request that goes on)."""
    return LIVE_GEN_RANK if live and kind == GEN else _KIND_RANK.get(kind, 0)


class PrefixEviction:
    planner: "Planner"
    index: PrefixIndex
    snap_pool: IdPool
    stats: dict[str, int]
    protected: set[int]
    allow_drop: bool

    @property
    def page_pool(self) -> IdPool:
        return self.planner.page_pool

    def reclaim_pages(self, need: int) -> bool:
        """Free `need` more pages by evicting unpinned snapshots (and the pages only their chains held),
        least recently used first — or, when even evicting them all would not do, change nothing."""
        if need <= 0:
            return True
        if not self.allow_drop:
            return False
        pool = self.page_pool
        kept = self.index.kept_by([n for n in self.index.snapshot_nodes() if self.snap_pool.refcount(n.snapshot) > 1])
        freeable = sum(1 for n in self.index.nodes.values() if id(n) not in kept and n.page >= 0 and pool.refcount(n.page) == 1)
        if pool.num_free + freeable < pool.num_free + need:
            return False
        target = pool.num_free + need
        spilled = [n for n in self.index.host_nodes()  # their chains hold device pages
                   if _device_chain(n) and id(n) not in self.protected]
        for n in sorted(self._evictable() + spilled, key=self.victim_order()):
            if self.index.nodes.get(n.key) is not n:
                continue
            self._drop(n, evicted=True)
            if pool.num_free >= target:
                break
        return True

    def drop_all_unpinned(self, host_too: bool = False, evicted: bool = True) -> None:
        """Every unpinned device snapshot, and the spilled ones whose chains still hold device pages (with
        `host_too`, every spilled one); `evicted`: counted as evictions."""
        for n in list(self._evictable()):
            self._drop(n, evicted)
        for n in list(self.index.host_nodes()):
            if self.index.nodes.get(n.key) is n and (host_too or _device_chain(n)):
                self._drop(n, evicted)

    @property
    def empty(self) -> bool:
        """Nothing cached: no node, so no snapshot and no page held by the index."""
        return not self.index.nodes

    def clear(self) -> None:
        """Forget every cached entry (the device lost its rows): host ids go back; device pools are rebuilt by the caller."""
        host = self.planner
        host.host_slot_pool.release([n.host_snapshot for n in self.index.host_nodes()])
        host.host_page_pool.release([n.host_page for n in self.index.nodes.values() if n.host_page >= 0])
        self.index.clear()

    def index_only_pages(self) -> list[int]:
        """Pages no request holds, only the index (in index order)."""
        held = {p for e in self.planner.entries() for p in e.pages}
        return [n.page for n in self.index.nodes.values() if n.page >= 0 and n.page not in held]

    def victim_order(self) -> Callable[[Node], tuple[int, int]]:
        """The eviction order now, least valuable first (Marconi-like, by the prefill a snapshot is likely
        to save): a PROMPT snapshot that a later one of its chain supersedes, other PROMPT ones (a prompt's
        end rarely starts another request), a live request's latest GEN one (its own next save replaces
        it; only a preemption would restore it), other GEN ones (a conversation's next turn), then BRANCH
        points (every request of a group); least recently used first within each."""
        live = {id(e.tail_node) for e in self.planner.entries() if e.tail_node is not None}

        def order(n: Node) -> tuple[int, int]:
            if n.kind == PROMPT and n.children:
                return SUPERSEDED, n.last_used
            return kind_rank(n.kind, id(n) in live), n.last_used
        return order

    def _evictable(self) -> list[Node]:
        return [n for n in self.index.snapshot_nodes()
                if self.snap_pool.refcount(n.snapshot) == 1 and id(n) not in self.protected]

    def _free_snapshot(self, rank: int = BRANCH_RANK) -> int | None:
        """A snapshot id, evicting the least valuable unpinned snapshot when none is free — only one whose
        kind ranks at most `rank` (a new snapshot never displaces a more valuable one). None: no room."""
        if self.snap_pool.num_free == 0:
            order = self.victim_order()
            victims = [n for n in self._evictable() if order(n)[0] <= rank]
            if not victims:
                return None
            self._drop(min(victims, key=order), evicted=True)
        return self.snap_pool.allocate(1)[0] if self.snap_pool.num_free else None

    def _drop(self, node: Node, evicted: bool) -> None:
        """Release the node's snapshot and prune the chain that no longer leads to one."""
        if node.snapshot >= 0:
            self.snap_pool.release([node.snapshot])
            node.snapshot = -1
            self.stats["evictions"] += int(evicted)
        elif node.host_snapshot >= 0:
            self.planner.host_slot_pool.release([node.host_snapshot])
            node.host_snapshot = -1
            self.stats["evictions"] += int(evicted)
        removed = self.index.prune(node)
        self.page_pool.release([n.page for n in removed if n.page >= 0])
        self.planner.host_page_pool.release([n.host_page for n in removed if n.host_page >= 0])


def _device_chain(n: Node | None) -> bool:
    """Whether `n` or an ancestor holds a device page."""
    while n is not None:
        if n.page >= 0:
            return True
        n = n.parent
    return False
