"""A generic auxiliary role set a model adds for its own per-request extras (e.g. per-layer embeddings)."""
from __future__ import annotations

import torch

from ..cache.errors import LayoutError
from ..cache.protocol import StateModule
from ..cache.roles import RoleSpec
from ..cache.sizing import register_aux_bytes
from .split import REPLICATED, HeadSplit


class AuxState(StateModule):
    """Named per-slot buffers `[layers, slots, *shape]`; zeroed at context start, moved like any role.

    Its per-slot bytes are registered under `name` in the sizing registry so budgets count them.
    """

    def __init__(self, name: str, roles: list[RoleSpec]) -> None:
        if not roles:
            raise LayoutError(f"auxiliary state {name!r} declares no roles")
        self.name = name
        self._roles = list(roles)
        per_slot = sum(r.row_bytes for r in self._roles)
        self._estimator = lambda _config, _n=per_slot: _n
        register_aux_bytes(name, self._estimator)

    @classmethod
    def single(cls, name: str, layers: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> "AuxState":
        return cls(name, [RoleSpec("value", layers, shape, dtype)])

    def roles(self) -> list[RoleSpec]:
        return list(self._roles)

    def head_splits(self) -> dict[str, HeadSplit]:
        """Model-owned extras are replicated over tensor-parallel ranks."""
        return {r.name: REPLICATED for r in self._roles}
