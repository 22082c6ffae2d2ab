"""Small managers for each recurrent layer kind, and helpers to fill and compare request state."""
from __future__ import annotations

import torch

from hybridcache.cache import CacheConfig, HybridCacheManager
from hybridcache.states import GDNState, KDAState, KVPages, Mamba2State

KINDS = ["mamba2", "gdn", "kda"]
PAGE_SIZE = 4
DRAFTS = 3


def make_state(kind: str, num_draft_tokens: int = DRAFTS, dtype: torch.dtype = torch.bfloat16):
    if kind == "mamba2":
        return Mamba2State(2, num_heads=4, head_dim=4, n_groups=2, state_size=8, conv_kernel=4,
                           dtype=dtype, num_draft_tokens=num_draft_tokens)
    if kind == "gdn":
        return GDNState(2, num_key_heads=2, num_value_heads=4, key_dim=8, value_dim=4, conv_kernel=4,
                        dtype=dtype, num_draft_tokens=num_draft_tokens)
    if kind == "kda":
        return KDAState(2, num_heads=2, head_dim=8, conv_kernel=4, dtype=dtype, num_draft_tokens=num_draft_tokens)
    raise ValueError(kind)


def make_manager(kind: str, device: str = "cpu", num_slots: int = 4, num_pages: int = 32,
                 host_requests: int = 4, num_dummy_slots: int = 1, **state_kw) -> HybridCacheManager:
    """A manager with exactly `num_slots` slots and about `num_pages` pages; host room for
    `host_requests` requests of up to 8 pages each."""
    state = make_state(kind, **state_kw)
    pages = KVPages(1, num_kv_heads=2, head_dim=4, page_size=PAGE_SIZE, dtype=torch.bfloat16)
    probe = HybridCacheManager([state], pages, CacheConfig(device_bytes=1 << 24, num_slots=1, page_size=PAGE_SIZE))
    sz = probe.sizing
    device_bytes = sz.bytes_for(num_slots + num_dummy_slots, num_pages)
    host_bytes = host_requests * (probe.host_tier.slot_layout.nbytes + 8 * probe.host_tier.page_layout.nbytes)
    cfg = CacheConfig(device_bytes=device_bytes, host_bytes=host_bytes, page_size=PAGE_SIZE, num_slots=num_slots,
                      num_dummy_slots=num_dummy_slots, device=device)
    return HybridCacheManager([state], pages, cfg)


def fill_random(mgr: HybridCacheManager, req_id, gen: torch.Generator) -> None:
    """Write random bytes into every role of the request's slot and its live pages (bookkeeping roles
    get valid values: pnat within HIST, buf_idx 0/1, pend_n within the draft count)."""
    e = mgr.entry(req_id)
    idx = torch.tensor([e.slot], device=mgr.device)
    for m in mgr.states:
        for name, t in mgr.state_tensors(m).items():
            if name == "pnat":
                val = torch.randint(0, m.hist - m.num_draft_tokens, (1, 1), generator=gen)
            elif name == "buf_idx":
                val = torch.randint(0, 2, (1, 1), generator=gen)
            elif name == "pend_n":
                val = torch.randint(0, m.num_draft_tokens + 1, (1, 1), generator=gen)
            else:
                val = torch.randn((t.shape[0], 1, *t.shape[2:]), generator=gen)
            t[:, idx] = val.to(t.dtype).to(mgr.device)
    npages = -(-e.num_tokens // mgr.page_size)
    pidx = torch.tensor(e.pages[:npages], dtype=torch.long, device=mgr.device)
    for t in mgr.page_tensors().values():
        t[:, pidx] = torch.randn((t.shape[0], len(pidx), *t.shape[2:]), generator=gen).to(t.dtype).to(mgr.device)


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].view(torch.uint8) if a[k].dtype != torch.bool else a[k],
                           b[k].view(torch.uint8) if b[k].dtype != torch.bool else b[k]), f"role {k} differs"


def run_to_generation(mgr: HybridCacheManager, req_id, prompt_len: int) -> None:
    """Add, prefill in one chunk, and switch to generation."""
    mgr.add_request(req_id)
    mgr.prepare_step([req_id], [prompt_len])
    mgr.accept()
    mgr.start_generation(req_id)
