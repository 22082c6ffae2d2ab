"""Replaceable scheduling policies: which request to preempt and how, and how to split the device budget.

The scheduler consults them; they read the cache's sizing and the requests' lengths and change nothing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from ..cache import Sizing
from ..cache.entries import pages_for
from .request import Request


SNAPSHOT_SHARE = 0.2  # of the device cache, at most, for prefix-cache snapshots
# With prefix caching the default host tier is this many times the device budget (at most a quarter of the
# machine's memory, never less than the device budget): cached prefixes that leave the device spill there with
# their pages. `benchmarks/prefix_cache.py` multiturn (32 conversations, 16 running) with 6 snapshot rows, as the
# 1B-class default budget gives: 0.85 of the hit ceiling on the H200 with a 1x host tier; on the CPU (`small`,
# 0.75x budget) 0.76 with 1x, 1.00 with 4x.
PREFIX_HOST_FACTOR = 4
SNAPSHOT_INTERVAL = 64  # tokens between prefix-cache snapshots, rounded down to a multiple of the page size


def snapshot_interval(page_size: int) -> int:
    return max(1, SNAPSHOT_INTERVAL // page_size) * page_size


def default_host_bytes(device_bytes: int, prefix_caching: bool) -> int:
    """The host tier's bytes when none are given: the device budget, or with prefix caching
    `PREFIX_HOST_FACTOR` times it, capped at a quarter of physical memory (but at least the device budget)."""
    if not prefix_caching:
        return device_bytes
    try:
        quarter = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError, AttributeError):  # not a POSIX system: no cap known
        quarter = PREFIX_HOST_FACTOR * device_bytes
    return max(device_bytes, min(PREFIX_HOST_FACTOR * device_bytes, quarter))


def snapshot_rows(sizing: Sizing, budget: int, max_num_seqs: int) -> int:
    """Slot rows for prefix-cache snapshots in a device budget: `SNAPSHOT_SHARE` of it, at most
    4 * max_num_seqs + 16 (a few per running request and one per prefix group), at least one."""
    return max(1, min(int(budget * SNAPSHOT_SHARE) // max(sizing.bytes_per_slot, 1), 4 * max_num_seqs + 16))


@dataclass
class PreemptionPolicy:
    """Victim: the latest arrival. Swap it to the host tier when moving its live bytes out and back costs
    less than prefilling its tokens again; otherwise drop it for re-prefill.

    The rates are estimates; the LLM sets the copy rate from its device.
    """

    swap_bytes_per_s: float = 5e9
    prefill_tokens_per_s: float = 2e4

    def victim(self, running: Sequence[Request]) -> Request:
        return running[-1]

    def swap(self, live_bytes: int, num_tokens: int) -> bool:
        return 2 * live_bytes / self.swap_bytes_per_s <= num_tokens / self.prefill_tokens_per_s


class DemandSplit:
    """The device split between recurrent slots and attention pages, from the requests seen.

    - Grow slots when a waiting request has no slot and the budget holds, at the requests' mean whole
      length (prompt + max_tokens + the verify lookahead), more requests than there are slots, with the
      running requests' and the blocked one's whole lengths still covered by the pages left.
    - Shrink idle slots into pages when a request cannot get the pages it needs and slots sit free.
    Any split keeps room for the longest request known, so nothing is stranded.
    """

    def __init__(self, sizing: Sizing, page_size: int, budget: int, num_dummies: int, max_num_seqs: int,
                 lookahead: int, follow_demand: bool = True) -> None:
        self.sizing, self.page_size, self.budget = sizing, page_size, budget
        self.follow_demand = follow_demand  # False: the split stays where it was carved
        self.num_dummies, self.max_num_seqs, self.lookahead = num_dummies, max_num_seqs, lookahead

    def whole_pages(self, req: Request) -> int:
        return self.whole_pages_of(len(req.prompt), req.params.max_tokens)

    def whole_pages_of(self, prompt_len: int, max_tokens: int) -> int:
        """Pages a request holds at its whole length (prompt + max_tokens + the verify lookahead)."""
        if not self.sizing.page_roles:
            return 0
        return pages_for(prompt_len + max_tokens + self.lookahead, self.page_size)

    def pages_beside(self, num_slots: int) -> int:
        if self.sizing.bytes_for(num_slots + self.num_dummies, 0) > self.budget:
            return -1
        return self.sizing.split(self.budget, num_slots + self.num_dummies)

    def initial_slots(self) -> int:
        """Before any request is seen: as many slots as `max_num_seqs`, each with at least one page."""
        n = self.max_num_seqs
        while n > 1 and self.pages_beside(n) < n * (1 if self.sizing.page_roles else 0):
            n -= 1
        return max(n, 1)

    def grow_to(self, num_slots: int, running: Sequence[Request], blocked: Request,
                known: Sequence[Request]) -> int | None:
        """Slots to grow to so that `blocked` (a waiting request) gets one, or None."""
        if not self.follow_demand or num_slots >= self.max_num_seqs or not known:
            return None
        mean = sum(self.whole_pages(r) for r in known) / len(known)
        target = num_slots
        while target < self.max_num_seqs and self.sizing.bytes_for(
            target + 1 + self.num_dummies, int((target + 1) * mean)
        ) <= self.budget:
            target += 1
        target = max(target, min(len(running) + 1, self.max_num_seqs))
        need = sum(self.whole_pages(r) for r in running) + self.whole_pages(blocked)
        longest = max(self.whole_pages(r) for r in known)
        while target > num_slots:
            pages = self.pages_beside(target)
            if pages >= need and pages >= longest:
                return target
            target -= 1
        return None

    def shrink_to(self, num_slots: int, num_live: int, wants_slot: bool) -> int | None:
        """Slots to shrink to when a request is short of pages while slots sit idle, or None."""
        target = max(num_live + int(wants_slot), 1)
        if not self.follow_demand or target >= num_slots:
            return None
        return target
