"""Programmatic dependent launch's switch (hybridcache/ops/pdl_triton.py): on only where asked, on CUDA.
Its kernels' PTX: tests/ops/test_compile_for_h200.py; its tokens on the GPU: tests/engine/test_cuda_graphs.py."""
from __future__ import annotations

import pytest
import torch

pdl_triton = pytest.importorskip("hybridcache.ops.pdl_triton", reason="triton is not installed")


@pytest.mark.parametrize("env", [None, "0", "1"])
def test_cpu_tensors_never_launch_with_pdl(env, monkeypatch):
    if env is None:
        monkeypatch.delenv(pdl_triton.ENV, raising=False)
    else:
        monkeypatch.setenv(pdl_triton.ENV, env)
    assert pdl_triton.pdl_launch(torch.zeros(2)) == {"PDL": False}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_launches_take_pdl_only_when_asked(monkeypatch):
    t = torch.zeros(2, device="cuda")
    monkeypatch.delenv(pdl_triton.ENV, raising=False)
    assert pdl_triton.pdl_launch(t) == {"PDL": False}
    monkeypatch.setenv(pdl_triton.ENV, "1")
    on = torch.cuda.get_device_capability()[0] >= 9
    assert pdl_triton.pdl_launch(t) == ({"PDL": True, "launch_pdl": True} if on else {"PDL": False})
