"""SIGINT holds (hybridcache/engine/interrupts.py): held inside, raised at the end, untouched outside."""
import signal
import threading

import pytest

from hybridcache.engine.interrupts import deferred_interrupts


@pytest.fixture(autouse=True)
def restore_sigint():
    yield
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_held_ctrl_c_is_raised_when_the_hold_ends():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            signal.raise_signal(signal.SIGINT)
            reached.append("after the signal")
            with deferred_interrupts():  # nested: the outer hold ends it
                reached.append("nested")
    assert reached == ["after the signal", "nested"]


def test_outside_a_hold_ctrl_c_is_raised_at_once():
    with deferred_interrupts():
        pass
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_the_application_handler_still_runs_outside_holds():
    calls = []
    signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    with deferred_interrupts():
        signal.raise_signal(signal.SIGINT)
        assert calls == []  # held
    assert calls == [signal.SIGINT]  # delivered to the application's handler when the hold ended
    signal.raise_signal(signal.SIGINT)
    assert calls == [signal.SIGINT, signal.SIGINT]


def test_holds_defer_again_after_one_was_raised_and_other_threads_do_not_hold():
    for _ in range(2):  # the nesting count is back at zero after the raise: the next hold takes effect again
        with pytest.raises(KeyboardInterrupt):
            with deferred_interrupts():
                with deferred_interrupts():
                    signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGINT)  # still held by the outer hold
    seen = []

    def other_thread():
        with deferred_interrupts():
            seen.append("ran")

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert seen == ["ran"]
    with pytest.raises(KeyboardInterrupt):  # the other thread's hold held nothing here
        signal.raise_signal(signal.SIGINT)
