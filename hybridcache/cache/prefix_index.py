"""The prefix index: a content-hash chain over full pages, from hash to cached page and recurrent snapshot.

Tensor-free. A node is one full page of some earlier request's tokens, named by the hash of its parent's
hash and its own token ids, so equal hashes mean equal prefixes (blake2b, 128 bits). A node holds one
reference on its page (`page`, -1 for a model without page roles) and may hold a snapshot id: the
recurrent state after exactly `depth * page_size` tokens. A node lives while it or a descendant holds a
snapshot; pages past the last snapshot of a chain restart nothing, so they are not kept.

A *partial* node is a leaf for a partly filled last page: the state after `(depth - 1) * page_size + fill`
tokens, saved where a request ended. Its key hashes the parent's key and its `fill` tokens under another
personalisation, so it never names a full page; a request that starts from it gets a copy of the page
(copy-on-write: it writes the page's free positions).

    root ── n1 ── n2 ── n3(snap) ── n4 ── n5(snap)      branch: n3's chain is shared, n4.. diverge
                         └── m4(snap)
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

ROOT = b""
BRANCH, PROMPT, GEN = "branch", "prompt", "gen"


def partial_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a partial node holding `tokens` (fewer than a page) below the page named `parent`."""
    row = np.asarray(tokens, dtype=np.int64)
    return hashlib.blake2b(parent + row.tobytes(), digest_size=16, person=b"partial").digest()


def chain_hashes(tokens: Sequence[int], page_size: int, parent: bytes = ROOT, first_page: int = 0) -> list[bytes]:
    """Hashes of the full pages of `tokens` from page `first_page` on, chained from `parent` (the hash of
    page `first_page - 1`, ROOT for the first page)."""
    out: list[bytes] = []
    full = len(tokens) // page_size
    if full <= first_page:
        return out
    ids = np.asarray(tokens[first_page * page_size : full * page_size], dtype=np.int64).reshape(-1, page_size)
    for row in ids:
        parent = hashlib.blake2b(parent + row.tobytes(), digest_size=16).digest()
        out.append(parent)
    return out


@dataclass(eq=False)
class Node:
    key: bytes
    parent: "Node | None"
    depth: int  # pages from the root through this one
    page: int
    snapshot: int = -1
    children: int = 0
    last_used: int = 0
    # why its snapshot was saved: BRANCH (requests' prompts part there), PROMPT (a prompt's last boundary) or
    # GEN (a generating request's latest state: its next save replaces it, and so does the save of a
    # request restored from it, such as a conversation's next turn)
    kind: str = ""
    hits: int = 0  # admissions that restored its snapshot (a second one makes it a BRANCH)
    fill: int = 0  # a partial node's tokens in its page (0: a full page)
    # the host tier (spilled, `prefix_spill.py`): the page and the snapshot each live in exactly one tier
    host_page: int = -1
    host_snapshot: int = -1

    def num_tokens(self, page_size: int) -> int:
        """Tokens from the root through this node."""
        return (self.depth - 1) * page_size + self.fill if self.fill else self.depth * page_size

    @property
    def cached(self) -> bool:
        """Whether it holds a snapshot in either tier."""
        return self.snapshot >= 0 or self.host_snapshot >= 0


class PrefixIndex:
    """Nodes by hash; the caller owns the reference counts of the pages and snapshot ids they name."""

    def __init__(self) -> None:
        self.nodes: dict[bytes, Node] = {}
        self.partials: dict[bytes, list[Node]] = {}  # parent key (ROOT for the first page) -> its partial nodes
        self.clock = 0  # a use counter for LRU order

    def __len__(self) -> int:
        return len(self.nodes)

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def walk(self, hashes: Sequence[bytes]) -> list[Node]:
        """The nodes of the longest prefix of `hashes` present in the index."""
        out = []
        for h in hashes:
            n = self.nodes.get(h)
            if n is None:
                break
            out.append(n)
        return out

    def add(self, key: bytes, parent: Node | None, page: int) -> Node:
        """A new leaf under `parent` (None: the root); the caller takes a reference on `page`."""
        assert key not in self.nodes, "node exists"
        node = Node(key, parent, 1 if parent is None else parent.depth + 1, page, last_used=self.clock)
        if parent is not None:
            parent.children += 1
        self.nodes[key] = node
        return node

    def clear(self) -> None:
        self.nodes.clear()
        self.partials.clear()

    def add_partial(self, key: bytes, parent: Node | None, page: int, fill: int) -> Node:
        """A new partial leaf of `fill` tokens under `parent`; the caller takes a reference on `page`."""
        node = self.add(key, parent, page)
        node.fill = fill
        self.partials.setdefault(parent.key if parent is not None else ROOT, []).append(node)
        return node

    def partials_below(self, parent: Node | None) -> list[Node]:
        return self.partials.get(parent.key if parent is not None else ROOT, [])

    def prune(self, node: Node | None) -> list[Node]:
        """Remove `node` and then its ancestors while each holds no snapshot (in either tier) and has no
        children; returns the removed nodes (the caller releases their pages)."""
        removed = []
        while node is not None and not node.cached and node.children == 0:
            del self.nodes[node.key]
            if node.fill:
                siblings = self.partials[node.parent.key if node.parent is not None else ROOT]
                siblings.remove(node)
                if not siblings:
                    del self.partials[node.parent.key if node.parent is not None else ROOT]
            removed.append(node)
            if node.parent is not None:
                node.parent.children -= 1
            node = node.parent
        return removed

    def snapshot_nodes(self) -> Iterator[Node]:
        """Nodes holding a device snapshot."""
        return (n for n in self.nodes.values() if n.snapshot >= 0)

    def host_nodes(self) -> Iterator[Node]:
        """Nodes holding a snapshot spilled to the host tier."""
        return (n for n in self.nodes.values() if n.host_snapshot >= 0)

    def kept_by(self, nodes: Sequence[Node]) -> set[int]:
        """ids of the nodes that stay when every snapshot but those of `nodes` is dropped: their chains."""
        kept: set[int] = set()
        for n in nodes:
            while n is not None and id(n) not in kept:
                kept.add(id(n))
                n = n.parent
        return kept
