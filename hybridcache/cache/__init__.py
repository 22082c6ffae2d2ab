"""The cache: a tensor-free `Planner` beside a per-device `CacheStore`, and the `HybridCacheManager` facade
over both. Knows nothing of models."""
from .config import CacheConfig
from .entries import Status
from .errors import (
    BudgetTooSmallError,
    CacheError,
    DoubleFreeError,
    DuplicateRequestError,
    HostTierFullError,
    IntegrityError,
    InvalidCountError,
    InvalidTransitionError,
    LayoutError,
    OutOfDeviceMemoryError,
    StateLostError,
    UnknownRequestError,
)
from .manager import HybridCacheManager
from .planner import Planner
from .plans import AcceptPlan, MovePlan, RecarvePlan, StepPlan
from .role_plan import plan_roles, sizing_of
from .protocol import PageRoles, StateModule
from .roles import RoleSpec
from .sizing import Sizing, aux_bytes_per_slot, register_aux_bytes, unregister_aux_bytes
from .step import StepIndices
from .store import CacheStore

__all__ = [
    "AcceptPlan", "BudgetTooSmallError", "CacheConfig", "CacheStore", "CacheError", "DoubleFreeError", "DuplicateRequestError",
    "HostTierFullError", "HybridCacheManager", "IntegrityError", "InvalidCountError", "InvalidTransitionError",
    "LayoutError", "MovePlan", "Planner", "RecarvePlan", "StateLostError", "StepPlan",
    "OutOfDeviceMemoryError", "PageRoles", "RoleSpec", "Sizing", "StateModule", "Status", "StepIndices",
    "UnknownRequestError", "aux_bytes_per_slot", "plan_roles", "sizing_of", "register_aux_bytes", "unregister_aux_bytes",
]
