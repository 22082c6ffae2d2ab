"""Ctrl-C without torn bookkeeping: SIGINT is held during critical sections and raised right after.

The first hold in the main thread installs one SIGINT handler and keeps it (a hold is then a flag, not two
system calls). Outside a hold it hands the signal to the handler it replaced, so the application sees
Ctrl-C as before; if the application installs another handler later, the next hold installs ours again.
"""
from __future__ import annotations

import _signal
import signal
import threading

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


class _Hold:
    """The context manager `deferred_interrupts()` returns: one object, counting the main thread's nested holds
    (a class rather than a generator, and `_signal.getsignal` rather than `signal.getsignal`, which tries an
    enum lookup that fails for a function: a hold cost 7.4 us, now 1.3, five a decode step; one core of this CPU)."""

    depth = 0

    def __enter__(self) -> None:
        global _held, _previous
        if threading.get_ident() != threading.main_thread().ident:
            return
        if self.depth == 0:
            if _signal.getsignal(signal.SIGINT) is not _on_sigint:
                _previous = signal.signal(signal.SIGINT, _on_sigint)
            _held = True  # from here a SIGINT only sets a flag: the count below cannot be torn
        self.depth += 1

    def __exit__(self, *exc: object) -> None:
        global _held, _received
        if threading.get_ident() != threading.main_thread().ident:
            return
        self.depth -= 1
        if self.depth == 0:
            _held = False  # the count is settled first: a SIGINT from here raises at once
            if _received:
                _received = False
                _deliver(signal.SIGINT, None)


_HOLD = _Hold()


def deferred_interrupts() -> _Hold:
    """Hold SIGINT for the duration of a `with`; one that arrived is delivered when the hold ends (Python's
    default handler raises KeyboardInterrupt there). Only the outermost hold in the main thread takes effect;
    nested holds and other threads just run."""
    return _HOLD
