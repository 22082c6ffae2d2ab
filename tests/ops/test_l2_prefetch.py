"""Weights asked of L2 ahead of their gemv (`ops/l2_prefetch_triton.py`, `ops/linear.py`'s `prefetch`): a hint
issued only on CUDA of compute capability 9.0 and up, after a one-row gemv, that changes no value. Its sm_90 PTX
(the bulk prefetch before PDL's wait): tests/ops/test_compile_for_h200.py; the engine's tokens with it on and off:
tests/engine/test_cuda_graphs.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridcache.ops import linear
from hybridcache.ops.triton_support import kernels_on_cpu, triton_testable

l2 = pytest.importorskip("hybridcache.ops.l2_prefetch_triton", reason="triton is not installed")
SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def _spy(monkeypatch) -> list[int]:
    """Bytes of each weight l2_prefetch is asked for from here on (the real prefetch still issued)."""
    asked, issue = [], l2.l2_prefetch
    monkeypatch.setattr(l2, "l2_prefetch", lambda w: (asked.append(w.numel() * w.element_size()), issue(w)))
    return asked


def test_cpu_and_unaligned_or_strided_weights_are_not_supported():
    assert not l2.supported(torch.zeros(64))
    if torch.cuda.is_available():
        w = torch.zeros(64, 64, device="cuda")
        assert not l2.supported(w.t()) and not l2.supported(w.view(-1)[1:])


@pytest.mark.skipif(not triton_testable(torch.empty(0)), reason="needs triton's interpreter (TRITON_INTERPRET=1)")
def test_the_interpreters_one_row_gemv_asks_for_nothing(monkeypatch):
    """CPU tensors through the kernels (the interpreter) take the gemv but never the prefetch; same values."""
    asked = _spy(monkeypatch)
    x, w, nxt = torch.randn(1, 64), torch.randn(32, 64), torch.randn(64, 32)
    with kernels_on_cpu():
        y = linear.linear(x, w, prefetch=nxt)
        assert torch.equal(y, linear.linear(x, w))
    assert asked == []
    torch.testing.assert_close(y, F.linear(x, w))


@pytest.mark.skipif(not SM90, reason="needs CUDA of compute capability 9.0 (bulk prefetch)")
@pytest.mark.parametrize("rows", [7, 2048, 5000])  # under one chunk and not a multiple of 16 bytes; 1; 3 programs
def test_the_prefetch_changes_no_value_and_captures(rows):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    w = torch.randn(rows, 2048 if rows > 7 else 3, device="cuda", generator=gen).to(torch.bfloat16)
    x = torch.randn(1, w.shape[1], device="cuda", generator=gen).to(torch.bfloat16)
    kept, before = w.clone(), linear.linear(x, w)
    l2.l2_prefetch(w)
    assert torch.equal(linear.linear(x, w), before) and torch.equal(w, kept)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        l2.l2_prefetch(w)
        y = linear.linear(x, w)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, before) and torch.equal(w, kept)


@pytest.mark.skipif(not SM90, reason="needs CUDA of compute capability 9.0 (bulk prefetch)")
def test_a_one_row_linear_asks_for_the_next_weight_only_where_switched_on(monkeypatch):
    """One row: the next weight is asked for, capped at PREFETCH_MAX_BYTES; two rows (cuBLAS) or the switch off:
    nothing; the outputs are those without `prefetch`."""
    asked = _spy(monkeypatch)
    x = torch.randn(2, 256, device="cuda").to(torch.bfloat16)
    w, nxt = torch.randn(512, 256, device="cuda").to(torch.bfloat16), torch.randn(256, 512, device="cuda")
    monkeypatch.setattr(linear, "PREFETCH_MAX_BYTES", 1 << 18)
    assert torch.equal(linear.linear(x[:1], w, prefetch=nxt), linear.linear(x[:1], w))
    assert asked == [1 << 18]  # nxt holds 512 KiB
    assert torch.equal(linear.linear(x, w, prefetch=nxt), linear.linear(x, w))
    monkeypatch.setattr(linear, "PREFETCH_AHEAD", False)
    linear.linear(x[:1], w, prefetch=nxt)
    assert asked == [1 << 18]
