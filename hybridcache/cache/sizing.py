"""Byte accounting: bytes per page, bytes per slot per role, and a registry of auxiliary per-slot bytes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .entries import pages_for
from .errors import BudgetTooSmallError, LayoutError
from .roles import RoleSpec, align

AuxEstimator = Callable[[object], int]
_AUX: dict[str, AuxEstimator] = {}


def register_aux_bytes(key: str, estimator: AuxEstimator) -> None:
    """A model module adds the per-slot bytes of its own auxiliary state under `key`.

    Registering the same estimator twice is harmless; a different one under a taken key is an error.
    """
    existing = _AUX.get(key)
    if existing is not None and existing is not estimator:
        raise LayoutError(f"auxiliary bytes {key!r} are already registered by another estimator")
    _AUX[key] = estimator


def unregister_aux_bytes(key: str) -> None:
    _AUX.pop(key, None)


def aux_bytes_per_slot(model_config: object) -> dict[str, int]:
    """Each registered estimator's bytes per slot for `model_config` (zero entries dropped)."""
    out = {k: int(f(model_config)) for k, f in _AUX.items()}
    return {k: v for k, v in out.items() if v}


@dataclass(frozen=True)
class Sizing:
    """What one slot and one page cost on the device, per role and in total."""

    slot_roles: tuple[RoleSpec, ...]
    page_roles: tuple[RoleSpec, ...]

    @property
    def bytes_per_slot_by_role(self) -> dict[str, int]:
        return {r.name: r.row_bytes for r in self.slot_roles}

    @property
    def live_bytes_per_slot_by_role(self) -> dict[str, int]:
        return {r.name: r.live_row_bytes for r in self.slot_roles}

    @property
    def bytes_per_slot(self) -> int:
        return sum(r.row_bytes for r in self.slot_roles)

    @property
    def bytes_per_page(self) -> int:
        return sum(r.row_bytes for r in self.page_roles)

    def bytes_for(self, num_slots: int, num_pages: int) -> int:
        """Arena bytes for the counts, alignment included (what the device tier carves)."""
        return sum(align(r.row_bytes * num_slots) for r in self.slot_roles) + sum(
            align(r.row_bytes * num_pages) for r in self.page_roles
        )

    def request_bytes(self, num_tokens: int, page_size: int) -> int:
        """Device bytes one request of `num_tokens` tokens holds: its pages and its slot, every role, with
        each role's alignment (so N times this always carves N such requests)."""
        return self.bytes_for(1, pages_for(num_tokens, page_size) if self.page_roles else 0)

    def split(self, budget: int, num_slots: int) -> int:
        """Pages that fit beside `num_slots` slots in `budget` bytes (at most; alignment included)."""
        if self.bytes_for(num_slots, 0) > budget:
            raise BudgetTooSmallError(
                f"{num_slots} slots need {self.bytes_for(num_slots, 0)} bytes; the budget is {budget}"
            )
        if not self.page_roles:
            return 0
        pages = max(0, (budget - self.bytes_for(num_slots, 0)) // max(self.bytes_per_page, 1))
        while pages > 0 and self.bytes_for(num_slots, pages) > budget:
            pages -= 1
        return pages

    def device_split(self, budget: int, num_slots: int | None, slot_share: float, dummies: int) -> tuple[int, int]:
        """(request slots, pages) of a device budget: `num_slots` slots (or `slot_share` of the bytes)
        beside `dummies` permanent ones, and the pages that fit the rest. Raises BudgetTooSmallError when
        one request (a slot, and a page if the model has page roles) does not fit."""
        if num_slots is None:
            num_slots = int(budget * slot_share) // max(self.bytes_per_slot, 1) - dummies
        num_pages = self.split(budget, num_slots + dummies) if num_slots >= 1 else 0
        if num_slots < 1 or (self.page_roles and num_pages < 1):
            raise BudgetTooSmallError(
                f"device budget {budget} B cannot hold one request: a slot costs {self.bytes_per_slot} B "
                f"(plus {dummies} dummy slots), a page {self.bytes_per_page} B"
            )
        return num_slots, num_pages
