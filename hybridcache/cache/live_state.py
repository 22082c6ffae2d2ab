"""Reading a request's live bytes from whichever tier holds it (tests and debugging)."""
from __future__ import annotations

import torch

from .copy_engine import gather_live, record_view
from .entries import Entry, Status
from .store import CacheStore


def read_live_state(store: CacheStore, e: Entry, live_pages: int) -> dict[str, torch.Tensor]:
    """Copies by role: slot roles `[layers, *live_shape]`, page roles `[layers, live_pages, *shape]`."""
    out: dict[str, torch.Tensor] = {}
    if e.on_device or e.status == Status.DUMMY:
        idx = torch.tensor([e.slot], dtype=torch.long, device=store.device)
        for r in store.slot_roles:
            out[r.name] = gather_live(r, store.device_tier.slots, idx)[:, 0].cpu().clone()
        pidx = torch.tensor(e.pages[:live_pages], dtype=torch.long, device=store.device)
        for r in store.page_roles:
            out[r.name] = store.device_tier.pages[r.name][:, pidx].cpu().clone()
    elif e.status == Status.SUSPENDED:
        host = store.host_tier
        rec = host.slot_records[e.host_slot : e.host_slot + 1]
        for r in store.slot_roles:
            out[r.name] = record_view(rec, r, host.slot_layout)[0].clone()
        prec = host.page_records[torch.tensor(e.host_pages, dtype=torch.long)]
        kept = torch.tensor(e.pages, dtype=torch.long, device=store.device)  # shared pages stay on the device
        for r in store.page_roles:
            moved = record_view(prec, r, host.page_layout).transpose(0, 1)
            out[r.name] = torch.cat([store.device_tier.pages[r.name][:, kept].cpu(), moved], 1).clone()
    return out
