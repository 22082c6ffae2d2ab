"""Which path a slot-facing prefill takes (GDN, KDA, Mamba2): flash-linear-attention's kernels where
`fla_usable` says so (CUDA, 16-bit or TF32-allowed fp32), the torch path otherwise — CPU tensors always,
and key heads wider than fla's 256."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

import hybridcache.ops.gdn.chunk as gdn_chunk
from hybridcache.ops import fla_kernels
from hybridcache.ops.fla_kernels import fla_usable
from hybridcache.ops.gdn.chunk import gdn_prefill
from tests.ops.delta_rule_cases import delta_inputs
from tests.ops.test_prefill_fla import ROUTES, K, V, cu_of, gdn_inputs, kda_inputs, mamba2_inputs


def tiny_args(op: str) -> tuple[tuple, dict]:
    """Arguments of the slot-facing prefill of `op` at a tiny shape (CPU)."""
    slots, has_initial = torch.tensor([0, -1]), torch.tensor([False, True])
    cu = cu_of([3, 2])
    if op == "mamba2":
        d = mamba2_inputs(5, 2, 4, 1, 4, torch.float32)
        return (d["x"], d["dt"], d["A"], d["B"], d["C"], torch.zeros(2, 2, 4, 4), slots, has_initial, cu), {}
    x = gdn_inputs(5, 1, 2, torch.float32) if op == "gdn" else kda_inputs(5, 2, torch.float32)
    return (*x, cu, torch.zeros(2, x[2].shape[1], K, V), slots, has_initial), dict(use_qk_l2norm_in_kernel=True)


@pytest.mark.parametrize("op", list(ROUTES))
@pytest.mark.parametrize("usable", [True, False])
def test_prefill_routes_to_fla_where_usable(monkeypatch, op, usable):
    module, prefill, fla_entry = ROUTES[op]
    calls = []
    monkeypatch.setattr(module, fla_entry, lambda *a, **kw: calls.append((a, kw)) or "fla")
    monkeypatch.setattr(module, "fla_usable", lambda t: usable)
    args, kwargs = tiny_args(op)
    out = prefill(*args, **kwargs)
    assert (out == "fla") if usable else isinstance(out, Tensor)
    assert len(calls) == int(usable)


def test_cpu_tensors_never_use_fla():
    assert not fla_usable(torch.zeros(1)) and not fla_usable(torch.zeros(1, dtype=torch.bfloat16))


def test_wide_key_heads_keep_the_torch_path(monkeypatch):
    """fla's delta-rule kernels assert K <= 256: wider keys take the torch path."""
    monkeypatch.setattr(gdn_chunk, "fla_usable", lambda t: True)
    monkeypatch.setattr(gdn_chunk, "gdn_prefill_fla", lambda *a, **kw: pytest.fail("fla called with K > 256"))
    q, k, v, g, beta = delta_inputs(1, 3, 1, 1, 257, 4, (1,))
    o = gdn_prefill(q[0], k[0], v[0], g[0], beta[0], cu_of([3]), torch.zeros(1, 1, 257, 4), torch.tensor([0]),
                    torch.tensor([False]))
    assert o.shape == (3, 1, 4)


@pytest.fixture
def matmul_precision():
    saved = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(saved)


def test_fla_usable_on_cuda_follows_fp32_matmul_precision(cuda_only, matmul_precision):
    if fla_kernels.fla_ops() is None:
        pytest.skip("fla-core is not importable")
    bf16, fp32 = (torch.zeros(1, device="cuda", dtype=dt) for dt in (torch.bfloat16, torch.float32))
    matmul_precision("highest")
    assert fla_usable(bf16) and not fla_usable(fp32)
    matmul_precision("high")
    assert fla_usable(fp32)
