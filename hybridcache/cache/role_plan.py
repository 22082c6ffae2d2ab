"""A model's role plan: its state modules' and page roles' names prefixed by module, and their sizing."""
from __future__ import annotations

import dataclasses
from typing import Sequence

from .protocol import PageRoles, StateModule
from .roles import RoleSpec, validate_roles
from .sizing import Sizing


def _prefixed(module_name: str, role: RoleSpec) -> RoleSpec:
    buffered = f"{module_name}.{role.buffered_by}" if role.buffered_by else None
    return dataclasses.replace(role, name=f"{module_name}.{role.name}", buffered_by=buffered)


def plan_roles(states: Sequence[StateModule], pages: PageRoles | None) -> tuple[list[RoleSpec], list[RoleSpec]]:
    """The slot roles and page roles of a model, with names prefixed by their module (`"mamba2.ssm"`)."""
    slot_roles = [_prefixed(m.name, r) for m in states for r in m.roles()]
    page_roles = [_prefixed(pages.name, r) for r in pages.roles()] if pages else []
    validate_roles(slot_roles + page_roles)
    return slot_roles, page_roles


def sizing_of(states: Sequence[StateModule], pages: PageRoles | None) -> Sizing:
    """What a slot and a page of this model cost, without allocating anything."""
    slot_roles, page_roles = plan_roles(states, pages)
    return Sizing(tuple(slot_roles), tuple(page_roles))
