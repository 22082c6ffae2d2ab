"""Routed experts: the grouped-GEMM dispatch (no host sync) against the per-expert loop it replaces."""
import pytest
import torch

from hybridcache.models.layers import experts as ex
from hybridcache.models.layers.experts import Experts, GatedExperts
from tests.ops.tripwire import no_host_sync


def _route(n: int, k: int, num_experts: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(num_experts, generator=g)[:k] for _ in range(n)])
    return index, torch.rand(n, k, generator=g)


@pytest.mark.parametrize("kind", [Experts, GatedExperts])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,num_experts", [(1, 4), (7, 8), (33, 16)])  # n=1 leaves most experts without a token
def test_grouped_dispatch_equals_the_per_expert_loop(kind, dtype, n, num_experts):
    torch.manual_seed(0)
    args = (num_experts, 32, 16, "silu" if kind is GatedExperts else "relu2", "cpu", dtype)
    layer = kind(*args)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(n, 32, dtype=dtype)
    index, weight = _route(n, 2, num_experts, seed=n)
    assert ex.grouped_supported(x, 32, 16)
    with no_host_sync():
        fast = layer(x, index, weight)
    stacks = (layer.up, layer.down) if kind is Experts else (layer.gate, layer.up, layer.down)
    loop = ex.dispatch(x, index, weight, stacks[0].shape[0], layer._expert, fast.dtype)
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(fast, loop, **tol)


def test_unaligned_widths_fall_back_to_the_loop():
    layer = Experts(4, 30, 10, "relu2", "cpu", torch.float32)  # 10 * 4 bytes is not a multiple of 16
    x = torch.randn(5, 30)
    assert not ex.grouped_supported(x, 10, 30)
    index, weight = _route(5, 2, 4, seed=1)
    assert layer(x, index, weight).shape == (5, 30)


@pytest.mark.parametrize("kind", [Experts, GatedExperts])
@pytest.mark.parametrize("k", [2, 3])
def test_dense_dispatch_equals_the_per_expert_loop(kind, k):
    """The small-batch path for CUDA without grouped GEMMs (fp32): every expert on every row, no host read."""
    torch.manual_seed(1)
    layer = kind(6, 32, 16, "silu" if kind is GatedExperts else "relu2", "cpu", torch.float32)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(5, 32)
    index, weight = _route(5, k, 6, seed=k)
    dtype = torch.float32
    with no_host_sync():
        dense = ex.dense(x, index, weight, 6, layer._expert, dtype)
    loop = ex.dispatch(x, index, weight, 6, layer._expert, dtype)
    torch.testing.assert_close(dense, loop, atol=1e-6, rtol=1e-5)
