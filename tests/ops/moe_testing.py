"""Shared by the MoE kernel tests (`test_moe_triton.py`, `test_moe_sort_and_tiles.py`, `test_moe_routers_triton.py`):
the device, the seeded inputs and routings, and the `launches` spy on the fused entry points. Import it after the
module-level skip (it imports the Triton kernels)."""
import pytest
import torch

from hybridcache.ops.moe import experts_sorted_triton, experts_triton, routers_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32, BF16 = torch.float32, torch.bfloat16
D, I = 72, 80  # hidden and intermediate sizes: neither a power of two, so tiles and inner steps are masked


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = F32) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=gen(seed))).to(device=DEVICE, dtype=dtype)


def routing(n: int, e: int, k: int, seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """k distinct experts a token and positive weights: index, weight [n, k]."""
    g = gen(seed)
    index = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).view(n, k)
    return index.to(DEVICE), torch.rand(n, k, generator=g).to(device=DEVICE, dtype=dtype)


def filled(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = gen(seed)
    for p in module.parameters():
        p.copy_((torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5).to(p.dtype))
    return module


@pytest.fixture
def launches(monkeypatch) -> list[str]:
    """The fused entry points the test's forwards called, by name."""
    calls: list[str] = []
    for module, name in ((experts_triton, "fused_experts_triton"), (experts_sorted_triton, "sorted_experts_triton"),
                         (routers_triton, "softmax_topk_triton"), (routers_triton, "group_topk_triton")):
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kw):
            calls.append(_name)
            return _real(*args, **kw)

        monkeypatch.setattr(module, name, spy)
    return calls
