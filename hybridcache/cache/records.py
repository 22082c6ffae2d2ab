"""A request's live bytes as host records, out of one engine and into another (disaggregated prefill and
decode): `export_records` reads them as a suspend would save them, changing nothing; `adopt` registers
them as a SUSPENDED request, a transaction of the planner and the store. `HybridCacheManager` exposes both."""
from __future__ import annotations

from typing import Hashable

import torch

from .entries import Status
from .errors import InvalidTransitionError, LayoutError
from .planner import Planner
from .store import CacheStore


def export_records(planner: Planner, store: CacheStore, req_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
    """A generating request's slot record `[slot nbytes]` and the page records of its committed tokens
    `[live pages, page nbytes]` (uint8, host memory; layouts `host_tier.slot_layout` / `page_layout`)."""
    e = planner.entry(req_id)
    if e.status != Status.GENERATION:
        raise InvalidTransitionError(f"request {req_id!r} is {e.status.name}; only GENERATION can be exported")
    rec = store.read_records(e.slot, e.pages[: planner.live_pages(e)])
    return rec.slot_records[0], rec.page_records


def adopt(planner: Planner, store: CacheStore, req_id: Hashable, num_tokens: int, slot_record: torch.Tensor,
          page_records: torch.Tensor) -> None:
    """Register a request suspended elsewhere (`export_records` of an engine with the same layouts) as
    SUSPENDED with `num_tokens` committed. Raises, changing nothing, on a duplicate id, records of the
    wrong shape, or a full host tier."""
    plan = planner.plan_adopt(req_id, num_tokens)
    host = store.host_tier
    try:
        if (tuple(slot_record.shape) != (host.slot_layout.nbytes,) or slot_record.dtype != torch.uint8
                or tuple(page_records.shape) != (len(plan.host_pages), host.page_layout.nbytes)
                or page_records.dtype != torch.uint8):
            raise LayoutError(
                f"records {tuple(slot_record.shape)} / {tuple(page_records.shape)} do not fit {num_tokens} tokens: "
                f"a slot record is {host.slot_layout.nbytes} B, a page record {host.page_layout.nbytes} B")
        store.write_host(plan.host_slots[0], plan.host_pages, slot_record, page_records)
    except BaseException:
        planner.cancel_move(plan)
        raise
    planner.commit_adopt(plan, num_tokens)
