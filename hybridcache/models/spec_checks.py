"""What the families' config specs share: building a frozen spec from config.json fields, and the checks of
integer fields and of the group-limited expert router."""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable, TypeVar

from .errors import UnsupportedConfigError

S = TypeVar("S")


def build_spec(cls: type[S], raw: dict[str, Any], **layout: Any) -> S:
    """`cls(**layout, **the fields of raw that cls declares)`, validated. `layout`: the fields the family
    derives itself (its layer kinds)."""
    kwargs = {f.name: raw[f.name] for f in fields(cls) if f.name in raw and f.name not in layout}
    spec = cls(**layout, **kwargs)
    spec.validate()
    return spec


def check_positive_ints(spec: Any, exempt: Callable[[str, Any], bool] = lambda name, value: False) -> None:
    """Raise UnsupportedConfigError for an `int` field (or a set `int | None` one) that is not a positive
    integer, unless `exempt(name, value)`."""
    for f in fields(spec):
        value = getattr(spec, f.name)
        if f.type in ("int", "int | None") and value is not None and (type(value) is not int or value < 1):
            if not exempt(f.name, value):
                raise UnsupportedConfigError(f.name, value, "must be a positive integer")


def check_grouped_router(experts_field: str, num_experts: int, n_group: int, topk_group: int, top_k: int) -> None:
    """What `TopKRouter` serves: experts in `n_group` equal groups of >= 2 (a group ranks by its two best),
    `topk_group` <= `n_group`, `top_k` <= the experts."""
    if num_experts % n_group or num_experts // n_group < 2:
        raise UnsupportedConfigError("n_group", n_group, f"must split {num_experts} experts into groups of >= 2")
    if topk_group > n_group:
        raise UnsupportedConfigError("topk_group", topk_group, f"exceeds n_group {n_group}")
    if top_k > num_experts:
        raise UnsupportedConfigError("num_experts_per_tok", top_k, f"exceeds {experts_field} {num_experts}")
