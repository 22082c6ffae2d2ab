"""A CPU stand-in for CUDA's sync-debug mode: the Python-level calls that make a host wait for the device
(`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `bool(t)`, `int(t)`, `float(t)`, `t` as an index,
`nonzero`). It runs on every CI machine, where the CUDA check cannot.

- `no_host_sync()` fails on the first such call (for ops that must make none);
- `count_host_syncs()` lets them run and records each one with the line that made it (for a whole
  engine step, which may make a budgeted few).

Syncs made inside C++ (a boolean mask index, `repeat_interleave` without `output_size`, a blocking copy to
the device) are invisible here; only CUDA's sync-debug mode sees those: `count_host_syncs(cuda=True)`
counts them too, on a CUDA run.
"""
from __future__ import annotations

import contextlib
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

_METHODS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")
_TORCH_DIR = str(Path(torch.__file__).parent)


@contextlib.contextmanager
def _patched(wrap: Callable[[str, Callable], Callable]) -> Iterator[None]:
    """Replace every host-sync entry point `fn` named `name` by `wrap(name, fn)` for the block."""
    saved = {name: getattr(torch.Tensor, name) for name in _METHODS}
    saved_nonzero = torch.nonzero
    try:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, wrap(f"Tensor.{name}", fn))
        torch.nonzero = wrap("torch.nonzero", saved_nonzero)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        torch.nonzero = saved_nonzero


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    def wrap(name: str, _fn: Callable) -> Callable:
        def fail(*_args, **_kwargs):
            raise AssertionError(f"host sync inside a sync-free op: {name}")

        return fail

    with _patched(wrap):
        yield


class HostSyncs:
    """The host-sync calls made inside `count_host_syncs()`: `calls` lists `(name, "file:line")` in order,
    the line being the first caller outside torch (and outside this module)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    @property
    def count(self) -> int:
        return len(self.calls)

    def summary(self) -> Counter:
        """How many times each (name, site) occurred."""
        return Counter(self.calls)

    def __repr__(self) -> str:
        lines = [f"{n} x {name} at {site}" for (name, site), n in self.summary().most_common()]
        return f"HostSyncs({self.count}: " + "; ".join(lines) + ")"


def _caller() -> str:
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_DIR)
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


@contextlib.contextmanager
def _cuda_syncs(record: HostSyncs, depth: list[int]) -> Iterator[None]:
    """CUDA's sync-debug mode set to "warn" for the block; each synchronising operation it reports outside
    a counted Python-level call goes into `record` as ("cuda sync", the Python line that made it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        warnings.filterwarnings("always", message=".*synchronizing CUDA operation")
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if "synchronizing CUDA operation" not in str(message):
                shown(message, category, filename, lineno, file, line)
            elif depth[0] == 0:
                record.calls.append(("cuda sync", f"{filename}:{lineno}"))

        warnings.showwarning = show
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)


@contextlib.contextmanager
def count_host_syncs(cuda: bool = False) -> Iterator[HostSyncs]:
    """Count, without failing, every host-sync call in the block. A call made while another one runs
    (torch calling `__index__` inside `tolist`, say) counts once: it is one wait for the device.
    `cuda=True` (a CUDA run) also counts what CUDA's sync-debug mode reports outside those calls."""
    record = HostSyncs()
    depth = [0]

    def wrap(name: str, fn: Callable) -> Callable:
        def counted(*args, **kwargs):
            if depth[0] == 0:
                record.calls.append((name, _caller()))
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1

        return counted

    with _patched(wrap), (_cuda_syncs(record, depth) if cuda else contextlib.nullcontext()):
        yield record
