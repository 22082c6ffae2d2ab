"""What two engines must share for one to resume the other's requests: the cache's record layouts."""
from __future__ import annotations

from typing import Any

from .errors import TransferLayoutError


def cache_layout(llm: Any) -> dict[str, Any]:
    """Plain data describing how `llm` saves a request: page size, vocabulary, and every slot and page role
    (name, layers, shape, dtype, double buffering) in record order. Refuses tensor-parallel engines (their
    ranks hold shards, and the transfer moves rank 0's only)."""
    if getattr(llm, "workers", None) is not None:
        raise TransferLayoutError("disaggregation works with tensor_parallel_size 1 only, for now")
    mgr = llm.manager

    def roles(rs):
        return [(r.name, r.layers, tuple(r.shape), str(r.dtype), r.buffered_by, r.buffer_dim) for r in rs]

    return {"page_size": mgr.page_size, "vocab_size": llm.vocab_size, "slot_roles": roles(mgr.slot_roles),
            "page_roles": roles(mgr.page_roles)}


def mismatch(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """Why a request saved under layout `theirs` cannot resume under `ours` (None when it can)."""
    for key in ("page_size", "vocab_size", "slot_roles", "page_roles"):
        if ours[key] != theirs[key]:
            return (f"the engines' {key} differ: producer {theirs[key]}, consumer {ours[key]} (the same checkpoint, "
                    f"dtype, page_size and speculative num_draft_tokens on both sides)")
    return None
