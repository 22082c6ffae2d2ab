"""Role declarations: the named per-slot (or per-page) buffers that hold a request's state."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import LayoutError

ALIGN = 64  # bytes; every role and record starts on this boundary so dtype views stay legal


def align(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


@dataclass(frozen=True)
class RoleSpec:
    """One buffer of shape `[layers, rows, *shape]`; a row is a slot (or a page, for page roles).

    `buffered_by` names a one-layer int role whose per-slot value selects the live half along
    `shape[buffer_dim]` (size 2): only that half is live and moves on suspend.
    """

    name: str
    layers: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    buffered_by: str | None = None
    buffer_dim: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise LayoutError("a role needs a name")
        if self.layers < 1:
            raise LayoutError(f"role {self.name!r}: layers must be >= 1, got {self.layers}")
        if any(d < 1 for d in self.shape):
            raise LayoutError(f"role {self.name!r}: every dimension must be >= 1, got {self.shape}")
        if self.buffered_by is not None:
            if not 0 <= self.buffer_dim < len(self.shape) or self.shape[self.buffer_dim] != 2:
                raise LayoutError(
                    f"role {self.name!r}: buffer_dim {self.buffer_dim} of shape {self.shape} must have size 2"
                )

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def row_bytes(self) -> int:
        """Bytes of one slot (or page) across all layers."""
        return self.layers * math.prod(self.shape) * self.itemsize

    @property
    def live_shape(self) -> tuple[int, ...]:
        """Per-row shape of the bytes that move on suspend (the live half when double buffered)."""
        if self.buffered_by is None:
            return self.shape
        return self.shape[: self.buffer_dim] + self.shape[self.buffer_dim + 1 :]

    @property
    def live_row_bytes(self) -> int:
        return self.layers * math.prod(self.live_shape) * self.itemsize


def validate_roles(roles: list[RoleSpec]) -> dict[str, RoleSpec]:
    """Names unique; every `buffered_by` refers to a one-layer integer role of scalar shape."""
    by_name: dict[str, RoleSpec] = {}
    for role in roles:
        if role.name in by_name:
            raise LayoutError(f"role {role.name!r} is declared twice")
        by_name[role.name] = role
    for role in roles:
        if role.buffered_by is None:
            continue
        index = by_name.get(role.buffered_by)
        if index is None:
            raise LayoutError(f"role {role.name!r} is buffered by unknown role {role.buffered_by!r}")
        if index.layers != 1 or index.shape != () or index.dtype.is_floating_point:
            raise LayoutError(f"role {index.name!r} indexes a buffer: it must be one-layer, scalar, integer")
        if index.buffered_by is not None:
            raise LayoutError(f"index role {index.name!r} cannot itself be buffered")
    return by_name


@dataclass(frozen=True)
class RecordLayout:
    """Where each role's live bytes sit inside one flat host record (a host slot or host page)."""

    offsets: dict[str, int]
    nbytes: int

    @staticmethod
    def of(roles: list[RoleSpec]) -> "RecordLayout":
        offsets, cursor = {}, 0
        for role in roles:
            offsets[role.name] = cursor
            cursor += align(role.live_row_bytes)
        return RecordLayout(offsets, max(cursor, ALIGN))
