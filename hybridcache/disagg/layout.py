"""What two engines must share for one to resume the other's requests: the unsharded cache record layouts
(requests travel in them whatever each side's tensor-parallel size), and each engine's `Resharder`."""
from __future__ import annotations

from typing import Any

from .errors import TransferLayoutError
from .reshard import Resharder, ShardLayout, unsharded


def resharder(llm: Any) -> Resharder:
    """Between `llm`'s ranks' records (one rank without tensor parallelism) and the unsharded layout."""
    k = llm.speculative.num_draft_tokens if llm.speculative else 0
    page_size = llm.manager.page_size
    size = llm.model.tp.size
    workers = getattr(llm, "workers", None)
    if (workers.tp.size if workers is not None else 1) != size:  # ranks that hold layers, not head shards
        raise TransferLayoutError("disaggregation does not work with pipeline_parallel_size > 1 yet")
    return Resharder(ShardLayout.of(unsharded(llm.model), k, page_size), ShardLayout.of(llm.model, k, page_size), size)


def cache_layout(llm: Any, reshard: Resharder) -> dict[str, Any]:
    """Plain data describing how a request of `llm` travels: page size, vocabulary, and every unsharded slot and
    page role (name, layers, shape, dtype, double buffering) in record order."""

    def roles(rs):
        return [(r.name, r.layers, tuple(r.shape), str(r.dtype), r.buffered_by, r.buffer_dim) for r in rs]

    return {"page_size": llm.manager.page_size, "vocab_size": llm.vocab_size,
            "slot_roles": roles(reshard.full.slot_roles), "page_roles": roles(reshard.full.page_roles)}


def mismatch(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """Why a request saved under layout `theirs` cannot resume under `ours` (None when it can)."""
    for key in ("page_size", "vocab_size", "slot_roles", "page_roles"):
        if ours[key] != theirs[key]:
            return (f"the engines' {key} differ: producer {theirs[key]}, consumer {ours[key]} (the same checkpoint, "
                    f"dtype, page_size and speculative num_draft_tokens on both sides)")
    return None
