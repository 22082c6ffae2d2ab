"""Between one engine's per-rank shards of a saved request and the unsharded layout (tensor-parallel size 1)
that travels between engines, so that the two sides of a pair may run different tensor-parallel sizes.

Each role's row splits by the state module's description (`states.split.HeadSplit`): along one axis, parts
of heads (or groups), each split over the ranks on its own. A part of F units at the unsharded size and l
at this engine's size N is held by rank r as units
  [r*l, r*l + l)      when l*N == F  (sharded: heads, groups N divides)
  [0, F)              when l == F    (replicated: MLA latent, PNAT, groups of one)
  [r*F // N, +1)      when l == 1 and N is a multiple of F (the one group / kv head of rank r's heads)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from ..cache.role_plan import plan_roles
from ..cache.roles import RecordLayout, RoleSpec
from ..parallel import SINGLE
from ..states.split import HeadSplit, role_splits
from .errors import TransferLayoutError

Records = tuple[torch.Tensor, torch.Tensor]  # slot record [slot nbytes], page records [pages, page nbytes]


@dataclass(frozen=True)
class ShardLayout:
    """The slot and page roles of one rank (or of the unsharded model) and how each splits by head."""

    slot_roles: tuple[RoleSpec, ...]
    page_roles: tuple[RoleSpec, ...]
    splits: dict[str, HeadSplit]

    @staticmethod
    def of(model: Any, num_draft_tokens: int, page_size: int) -> "ShardLayout":
        states, pages = model.state_modules(num_draft_tokens), model.page_roles(page_size)
        slot_roles, page_roles = plan_roles(states, pages)
        splits = {}
        for module in [*states, *([pages] if pages else [])]:
            splits.update(role_splits(module))
        missing = [r.name for r in slot_roles + page_roles if r.name not in splits]
        if missing:
            raise TransferLayoutError(f"roles {missing} do not say how they split over tensor-parallel ranks")
        return ShardLayout(tuple(slot_roles), tuple(page_roles), splits)


def unsharded(model: Any) -> Any:
    """The same model description at tensor-parallel size 1 (only its cache contract is used)."""
    whole = copy.copy(model)
    whole.tp = SINGLE
    return whole


class Resharder:
    """Joins the `size` ranks' records of one request into the unsharded layout, and slices them back."""

    def __init__(self, full: ShardLayout, local: ShardLayout, size: int) -> None:
        self.full, self.local, self.size = full, local, size
        self.full_slot, self.full_page = RecordLayout.of(list(full.slot_roles)), RecordLayout.of(list(full.page_roles))
        self.local_slot = RecordLayout.of(list(local.slot_roles))
        self.local_page = RecordLayout.of(list(local.page_roles))
        if [r.name for r in full.slot_roles + full.page_roles] != [r.name for r in local.slot_roles + local.page_roles]:
            raise TransferLayoutError("a rank's roles differ from the unsharded model's")

    def join(self, shards: list[Records]) -> Records:
        """Every rank's records, by rank -> the unsharded records."""
        if len(shards) != self.size:
            raise TransferLayoutError(f"{len(shards)} shards for {self.size} ranks")
        if self.size == 1:
            return shards[0]
        slot = self._join([s[0][None] for s in shards], self.full.slot_roles, self.local.slot_roles,
                          self.full_slot, self.local_slot)[0]
        pages = self._join([s[1] for s in shards], self.full.page_roles, self.local.page_roles,
                           self.full_page, self.local_page)
        return slot, pages

    def split(self, records: Records) -> list[Records]:
        """The unsharded records -> every rank's, by rank."""
        slot, pages = records
        if self.size == 1:
            return [records]
        slots = self._split(slot[None], self.full.slot_roles, self.local.slot_roles, self.full_slot, self.local_slot)
        pages_ = self._split(pages, self.full.page_roles, self.local.page_roles, self.full_page, self.local_page)
        return [(s[0], p) for s, p in zip(slots, pages_)]

    # ------------------------------------------------------------------ internals
    def _join(self, recs, full_roles, local_roles, full_layout, local_layout) -> torch.Tensor:
        n = recs[0].shape[0]
        out = torch.zeros(n, full_layout.nbytes, dtype=torch.uint8)
        for fr, lr in zip(full_roles, local_roles):
            views = [_view(rec, local_layout, lr) for rec in recs]
            whole = torch.empty(n, fr.layers, *fr.live_shape, dtype=fr.dtype)
            for rank, view in enumerate(views):
                for f_at, l_at, count in self._pieces(fr, lr, rank):
                    whole.narrow(f_at[0], f_at[1], count).copy_(view.narrow(l_at[0], l_at[1], count))
            _pack(out, full_layout, fr, whole)
        return out

    def _split(self, rec, full_roles, local_roles, full_layout, local_layout) -> list[torch.Tensor]:
        n = rec.shape[0]
        outs = [torch.zeros(n, local_layout.nbytes, dtype=torch.uint8) for _ in range(self.size)]
        for fr, lr in zip(full_roles, local_roles):
            whole = _view(rec, full_layout, fr)
            for rank, out in enumerate(outs):
                part = torch.empty(n, lr.layers, *lr.live_shape, dtype=lr.dtype)
                for f_at, l_at, count in self._pieces(fr, lr, rank):
                    part.narrow(l_at[0], l_at[1], count).copy_(whole.narrow(f_at[0], f_at[1], count))
                _pack(out, local_layout, lr, part)
        return outs

    def _pieces(self, fr: RoleSpec, lr: RoleSpec, rank: int):
        """(dim, start) in the unsharded view, (dim, start) in the rank's view, length: what rank `rank` holds
        (views `[n, layers, *live_shape]`)."""
        fs, ls = self.full.splits[fr.name], self.local.splits[lr.name]
        if fs.axis is None:
            if fr.live_shape != lr.live_shape:
                raise TransferLayoutError(f"replicated role {fr.name} differs between ranks and the whole")
            return [((1, 0), (1, 0), fr.layers)]
        if fs.axis != ls.axis or len(fs.parts) != len(ls.parts):
            raise TransferLayoutError(f"role {fr.name} splits differently at tensor-parallel size {self.size}")
        dim, f_off, l_off, pieces = 2 + fs.axis, 0, 0, []
        for (F, width), (l, lwidth) in zip(fs.parts, ls.parts):
            if width != lwidth:
                raise TransferLayoutError(f"role {fr.name}: unit width {width} vs {lwidth}")
            first = _first_unit(F, l, self.size, rank, fr.name)
            pieces.append(((dim, f_off + first * width), (dim, l_off), l * width))
            f_off, l_off = f_off + F * width, l_off + l * width
        return pieces


def _first_unit(F: int, l: int, size: int, rank: int, name: str) -> int:
    if l * size == F:
        return rank * l
    if l == F:
        return 0
    if l == 1 and size % F == 0:
        return rank * F // size
    raise TransferLayoutError(f"role {name}: {l} of {F} units per rank at tensor-parallel size {size}")


def _view(rec: torch.Tensor, layout: RecordLayout, role: RoleSpec) -> torch.Tensor:
    """Records `[n, nbytes]` -> the role's live bytes `[n, layers, *live_shape]` (a copy)."""
    at, nbytes = layout.offsets[role.name], role.live_row_bytes
    return rec[:, at : at + nbytes].contiguous().view(role.dtype).view(rec.shape[0], role.layers, *role.live_shape)


def _pack(out: torch.Tensor, layout: RecordLayout, role: RoleSpec, value: torch.Tensor) -> None:
    at, nbytes = layout.offsets[role.name], role.live_row_bytes
    out[:, at : at + nbytes] = value.contiguous().view(out.shape[0], -1).view(torch.uint8)
