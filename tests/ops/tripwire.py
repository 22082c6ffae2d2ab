"""A CPU stand-in for CUDA's sync-debug mode: fail on the Python-level calls that make a host wait for
the device (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `bool(t)`, `int(t)`, `float(t)`, `t` as an
index, `nonzero`). It runs on every CI machine, where the CUDA check cannot."""
from __future__ import annotations

import contextlib

import torch

_METHODS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def no_host_sync():
    def trip(name: str):
        def fail(*_args, **_kwargs):
            raise AssertionError(f"host sync inside a sync-free op: {name}")

        return fail

    saved = {name: getattr(torch.Tensor, name) for name in _METHODS}
    saved_nonzero = torch.nonzero
    try:
        for name in _METHODS:
            setattr(torch.Tensor, name, trip(f"Tensor.{name}"))
        torch.nonzero = trip("torch.nonzero")
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        torch.nonzero = saved_nonzero
