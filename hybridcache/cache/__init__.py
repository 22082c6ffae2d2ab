"""Pools, tiers, copy engine and the `HybridCacheManager` facade. Knows nothing of models."""
from .config import CacheConfig
from .entries import Status
from .errors import (
    BudgetTooSmallError,
    CacheError,
    DoubleFreeError,
    DuplicateRequestError,
    HostTierFullError,
    IntegrityError,
    InvalidTransitionError,
    LayoutError,
    OutOfDeviceMemoryError,
    UnknownRequestError,
)
from .manager import HybridCacheManager
from .plan import plan_roles, sizing_of
from .protocol import PageRoles, StateModule
from .roles import RoleSpec
from .sizing import Sizing, aux_bytes_per_slot, register_aux_bytes, unregister_aux_bytes
from .step import StepIndices

__all__ = [
    "BudgetTooSmallError", "CacheConfig", "CacheError", "DoubleFreeError", "DuplicateRequestError",
    "HostTierFullError", "HybridCacheManager", "IntegrityError", "InvalidTransitionError", "LayoutError",
    "OutOfDeviceMemoryError", "PageRoles", "RoleSpec", "Sizing", "StateModule", "Status", "StepIndices",
    "UnknownRequestError", "aux_bytes_per_slot", "plan_roles", "sizing_of", "register_aux_bytes", "unregister_aux_bytes",
]
