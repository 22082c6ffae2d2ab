"""GQA and gated attention's fused q/k/v projection: `qkv_weight` (and `qkv_bias`) whose row slices are the
checkpoint's q_proj / k_proj / v_proj tensors (views the loader fills name for name), sharded under tensor
parallelism as the three column-parallel linears were. End to end the layers are checked against
transformers (tests/models) and sharded against unsharded (tests/parallel/test_sharded_forward.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridcache.models.layers.attention import PagedGQAAttention
from hybridcache.models.layers.gated_attention import GatedPagedAttention
from hybridcache.models.layers.params import checkpoint_targets
from hybridcache.models.layers.rope import PartialRoPE
from hybridcache.parallel import TPGroup

D, HQ, HKV, DH = 32, 4, 2, 8


def build(kind: str, tp: TPGroup = TPGroup(), heads: tuple[int, int] = (HQ, HKV)):
    if kind == "gqa":
        return PagedGQAAttention(0, D, *heads, DH, True, "cpu", torch.float32, tp)
    return GatedPagedAttention(0, D, *heads, DH, True, PartialRoPE(DH, 4, 1e4, "cpu"), 1e-6, "cpu",
                               torch.float32, tp)


@pytest.mark.parametrize("kind", ["gqa", "gated"])
def test_checkpoint_names_are_row_views_of_the_fused_weight(kind: str) -> None:
    layer = build(kind)
    q_rows = HQ * DH * (2 if kind == "gated" else 1)
    shapes = {"q_proj": q_rows, "k_proj": HKV * DH, "v_proj": HKV * DH}
    gen = torch.Generator().manual_seed(0)
    ckpt = {f"{p}.{t}": torch.randn(n, D, generator=gen) if t == "weight" else torch.randn(n, generator=gen)
            for p, n in shapes.items() for t in ("weight", "bias")}
    targets = checkpoint_targets(layer)
    assert {n for n in targets if not n.startswith(("o_proj", "q_norm", "k_norm"))} == set(ckpt)
    with torch.no_grad():
        for name, value in ckpt.items():
            targets[name].copy_(value)
    order = ("q_proj", "k_proj", "v_proj")
    assert torch.equal(layer.qkv_weight, torch.cat([ckpt[f"{p}.weight"] for p in order]))
    assert torch.equal(layer.qkv_bias, torch.cat([ckpt[f"{p}.bias"] for p in order]))
    names = [n for n, _ in layer.named_parameters()]
    assert "qkv_weight" in names and not any(n.startswith(order) for n in names)
    x = torch.randn(5, D, generator=gen)
    fused = F.linear(x, layer.qkv_weight, layer.qkv_bias)
    separate = torch.cat([F.linear(x, ckpt[f"{p}.weight"], ckpt[f"{p}.bias"]) for p in order], dim=-1)
    torch.testing.assert_close(fused, separate)


@pytest.mark.parametrize("kind", ["gqa", "gated"])
@pytest.mark.parametrize("heads", [(HQ, HKV), (HQ, 1)], ids=["kv sharded", "kv replicated"])
def test_tensor_parallel_rank_holds_its_rows(kind: str, heads: tuple[int, int]) -> None:
    """Rank 1 of 2: its query heads (with their gate channels) and the K/V heads they read, marked for the
    loader with the checkpoint's full row count."""
    hq, hkv = heads
    layer = build(kind, TPGroup(1, 2), heads)
    per_q = DH * (2 if kind == "gated" else 1)
    kv0, kvn = ((hkv // 2) * DH, (hkv // 2) * DH) if hkv > 1 else (0, DH)
    want = {"q_proj": (hq * per_q, (hq // 2 * per_q, hq // 2 * per_q)), "k_proj": (hkv * DH, (kv0, kvn)),
            "v_proj": (hkv * DH, (kv0, kvn))}
    targets = checkpoint_targets(layer)
    for proj, (full, share) in want.items():
        for t in ("weight", "bias"):
            tensor = targets[f"{proj}.{t}"]
            assert tensor.shape[0] == share[1]
            mark = getattr(tensor, "shard", None)
            if share == (0, full):
                assert mark is None, f"{proj}.{t} covers the checkpoint: no mark"
            else:
                assert (mark.dim, mark.full, mark.ranges) == (0, full, (share,)), f"{proj}.{t}"
    assert layer.qkv_weight.shape == (sum(s[1] for _, s in want.values()), D)
