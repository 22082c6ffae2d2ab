"""Where the Triton kernels run: CUDA tensors when triton imports; CPU tensors only in Triton's interpreter.

The ops dispatch with `runs_triton(t)`: CUDA and triton importable. CPU tensors always take the torch paths
(the interpreter is for tests, which call the `*_triton` entry points directly with TRITON_INTERPRET=1).
"""
from __future__ import annotations

import importlib.util
import os

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def runs_triton(t: torch.Tensor) -> bool:
    """Whether an op on `t` dispatches to its Triton kernel (CUDA, triton importable)."""
    return HAS_TRITON and t.is_cuda


def triton_testable(t: torch.Tensor) -> bool:
    """Whether a test may call a Triton entry point on `t` directly (CUDA, or CPU under the interpreter)."""
    return HAS_TRITON and (t.is_cuda or (t.device.type == "cpu" and interpreting()))
