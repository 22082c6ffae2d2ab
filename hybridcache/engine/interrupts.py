"""Ctrl-C without torn bookkeeping: SIGINT is held during critical sections and raised right after."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

_held = False
_received: list[int] = []


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT for the duration, then raise KeyboardInterrupt if one arrived. Only the outermost hold
    in the main thread installs the handler; nested holds and other threads just run."""
    global _held
    if _held or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: _received.append(signum))
    _held = True
    try:
        yield
    finally:
        _held = False
        signal.signal(signal.SIGINT, previous)
        if _received:
            _received.clear()
            raise KeyboardInterrupt
