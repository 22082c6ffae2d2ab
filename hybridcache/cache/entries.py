"""What the manager knows of one request: its status and what it holds in each tier."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Hashable


class Status(IntEnum):
    WAITING = 0  # holds nothing; the next step starts its context from a zero state
    CONTEXT = 1  # prefill chunks; holds a device slot and pages
    GENERATION = 2  # decode / verify steps; holds a device slot and pages
    SUSPENDED = 3  # holds a host slot and host pages only
    DUMMY = 4  # padding row: a permanent device slot, never saved


@dataclass
class Entry:
    req_id: Hashable
    status: Status
    slot: int = -1
    pages: list[int] = field(default_factory=list)
    num_tokens: int = 0  # tokens whose K/V and recurrent state are committed
    host_slot: int = -1
    host_pages: list[int] = field(default_factory=list)

    @property
    def on_device(self) -> bool:
        return self.status in (Status.CONTEXT, Status.GENERATION)


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)
