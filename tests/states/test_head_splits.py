"""Every state module and page role set says how each of its roles splits over tensor-parallel ranks, and
the description adds up: the parts along the axis fill the live shape's dimension exactly."""
from __future__ import annotations

import math

import pytest
import torch

from hybridcache.states import AuxState, GDNState, KDAState, KVPages, Mamba2State, MLAPages

MODULES = [
    Mamba2State(2, num_heads=4, head_dim=3, n_groups=2, state_size=5, conv_kernel=4),
    Mamba2State(2, num_heads=4, head_dim=3, n_groups=1, state_size=5, conv_kernel=4, num_draft_tokens=2),
    GDNState(2, num_key_heads=2, num_value_heads=4, key_dim=3, value_dim=5, conv_kernel=4, num_draft_tokens=3),
    KDAState(2, num_heads=2, head_dim=4, conv_kernel=4, num_draft_tokens=2),
    KVPages(3, num_kv_heads=2, head_dim=4, page_size=4, dtype=torch.float32),
    MLAPages(3, kv_lora_rank=8, rope_dim=4, page_size=4, dtype=torch.float32),
    AuxState.single("aux_test_splits", 1, (3,)),
]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: f"{m.name}-{len(m.roles())}")
def test_every_role_has_a_split_that_fills_its_axis(module):
    splits = module.head_splits()
    roles = {r.name: r for r in module.roles()}
    assert sorted(splits) == sorted(roles)
    for name, split in splits.items():
        if split.axis is None:
            continue
        live = roles[name].live_shape
        assert sum(units * width for units, width in split.parts) == live[split.axis], name
        assert math.prod(live) % live[split.axis] == 0
