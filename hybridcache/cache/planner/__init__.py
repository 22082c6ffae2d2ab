"""`Planner`: the tensor-free half of the cache. Ids, entries, the lifecycle, and the decisions.

It owns the id pools of both tiers and every request's entry; it never touches a tensor. Each call
either completes or raises having changed nothing. Operations that move bytes are two-phase: `plan_*`
reserves ids and returns a plan, the store copies, then `commit_*` (or `cancel_*`) finishes.

The operations are split by job over this package's files; `Planner` is all of them over one state
(`core.PlannerCore`).
"""
from __future__ import annotations

from .core import FREED_REMEMBERED, PlannerCore
from .lifecycle import Lifecycle
from .prefix import PrefixAdmission
from .rebalance import Rebalance
from .spill import Spill
from .steps import Steps


class Planner(Lifecycle, Steps, PrefixAdmission, Rebalance, Spill):
    """Slots and pages of both tiers, and what each request holds.

    `num_slots` request slots beside `num_dummies` permanent ones, `num_pages` pages; `has_pages` False
    for a model without attention layers (it holds no pages). With `snapshot_interval` > 0, prefix
    caching (`prefix_cache.py`) keeps up to `num_snapshots` recurrent snapshots in slot rows between the
    dummies and the request slots.
    """


__all__ = ["FREED_REMEMBERED", "Planner", "PlannerCore"]
