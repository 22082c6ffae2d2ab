"""Ctrl-C without torn bookkeeping: SIGINT is held during critical sections and raised right after.

The first hold in the main thread installs one SIGINT handler and keeps it (a hold is then a flag, not two
system calls). Outside a hold it hands the signal to the handler it replaced, so the application sees
Ctrl-C as before; if the application installs another handler later, the next hold installs ours again.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

_held = False
_received = False
_previous: object = signal.default_int_handler


def _on_sigint(signum: int, frame: object) -> None:
    global _received
    if _held:
        _received = True
    else:
        _deliver(signum, frame)


def _deliver(signum: int, frame: object) -> None:
    """What the replaced handler does: Python's default raises KeyboardInterrupt."""
    if callable(_previous):
        _previous(signum, frame)
    elif _previous != signal.SIG_IGN:  # SIG_DFL
        raise KeyboardInterrupt


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT for the duration; one that arrived is delivered when the hold ends (Python's default
    handler raises KeyboardInterrupt there). Only the outermost hold in the main thread takes effect;
    nested holds and other threads just run."""
    global _held, _received, _previous
    if _held or threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGINT) is not _on_sigint:
        _previous = signal.signal(signal.SIGINT, _on_sigint)
    _held = True
    try:
        yield
    finally:
        _held = False
        if _received:
            _received = False
            _deliver(signal.SIGINT, None)
