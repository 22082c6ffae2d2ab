"""Where the Triton kernels run: CUDA tensors when triton imports; CPU tensors only in Triton's interpreter.

The ops dispatch with `runs_triton(t)`: CUDA and triton importable. CPU tensors always take the torch paths
(the interpreter is for tests, which call the `*_triton` entry points directly with TRITON_INTERPRET=1).
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
_kernels_on_cpu = False


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def runs_triton(t: torch.Tensor) -> bool:
    """Whether an op on `t` dispatches to its Triton kernel (CUDA, triton importable; CPU tensors only
    inside `kernels_on_cpu`)."""
    return HAS_TRITON and (t.is_cuda or (_kernels_on_cpu and t.device.type == "cpu"))


@contextmanager
def kernels_on_cpu() -> Iterator[None]:
    """Tests only: inside, CPU tensors dispatch to the Triton kernels too, run by Triton's interpreter
    (TRITON_INTERPRET=1 must have been set before triton was imported), so a whole model can run through
    the kernels' glue without a GPU. Raises RuntimeError outside the interpreter."""
    global _kernels_on_cpu
    if not (HAS_TRITON and interpreting()):
        raise RuntimeError("kernels_on_cpu needs triton and TRITON_INTERPRET=1")
    _kernels_on_cpu = True
    try:
        yield
    finally:
        _kernels_on_cpu = False


def triton_testable(t: torch.Tensor) -> bool:
    """Whether a test may call a Triton entry point on `t` directly (CUDA, or CPU under the interpreter)."""
    return HAS_TRITON and (t.is_cuda or (t.device.type == "cpu" and interpreting()))


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (read once per device), which the kernels size their grids
    by; 4 for the CPU interpreter, so that tests there still split work over several programs."""
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 4


@cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
