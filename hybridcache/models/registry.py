"""`model_type` -> model class. A family registers itself in its own module with `@register`."""
from __future__ import annotations

from typing import Callable, TypeVar

from .errors import UnsupportedModelTypeError

_FAMILIES: dict[str, type] = {}
T = TypeVar("T", bound=type)


def register(model_type: str) -> Callable[[T], T]:
    """Class decorator: serve checkpoints whose config.json says `model_type`."""

    def wrap(cls: T) -> T:
        if model_type in _FAMILIES and _FAMILIES[model_type] is not cls:
            raise ValueError(f"model_type {model_type!r} is already served by {_FAMILIES[model_type].__name__}")
        _FAMILIES[model_type] = cls
        return cls

    return wrap


def supported_model_types() -> list[str]:
    return sorted(_FAMILIES)


def model_class(model_type: object) -> type:
    """The registered class; raises UnsupportedModelTypeError listing the supported types."""
    cls = _FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if cls is None:
        raise UnsupportedModelTypeError(model_type, supported_model_types())
    return cls
