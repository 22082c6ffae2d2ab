"""The planner walk's vocabulary (`test_planner_stateful`): request statuses and planner phases by short
names, and the two ways its rules draw — `random.Random` for the plain walk, hypothesis's `data` for the
rule-based machine (same calls, so one set of rules serves both)."""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from hybridcache.cache import Status

WAITING, CONTEXT, GENERATION, SUSPENDED, DUMMY = (
    Status.WAITING, Status.CONTEXT, Status.GENERATION, Status.SUSPENDED, Status.DUMMY)
ON_DEVICE = (CONTEXT, GENERATION)
IDLE, PENDING, MOVING, RECARVING = "idle", "pending", "moving", "recarving"


@dataclass
class Req:
    """What the shadow expects of one request."""

    status: Status
    tokens: int = 0
    pages: int = 0  # device pages held
    host_pages: int = 0
    fresh: bool = False  # its next step starts from a zero state
    dummy_slot: int = -1



class RandomDraw:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, seq: Sequence):
        return self.rng.choice(seq)

    def subset(self, seq: Sequence, lo: int = 1, hi: int = 5) -> list:
        k = self.rng.randint(min(lo, len(seq)), min(hi, len(seq)))
        return self.rng.sample(list(seq), k)


class DataDraw:
    def __init__(self, data) -> None:
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def pick(self, seq: Sequence):
        return self.data.draw(st.sampled_from(list(seq)))

    def subset(self, seq: Sequence, lo: int = 1, hi: int = 5) -> list:
        if not seq:
            return []
        return self.data.draw(st.lists(st.sampled_from(list(seq)), min_size=min(lo, len(seq)),
                                       max_size=min(hi, len(seq)), unique=True))
