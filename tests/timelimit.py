"""A time limit for a block of synchronous test code, by SIGALRM's timer: the tests that must
fail rather than hang (onnx's conformance cases, mutated model files) share it."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def time_limit(seconds: float, expired: Callable[[], BaseException]) -> Iterator[None]:
    """Raise ``expired()`` in the main thread once ``seconds`` have passed.

    The exception interrupts the block where the main thread next runs Python (a wait on
    another thread included). Code that never returns to Python (a native loop that does not
    end) is not interrupted. No limit where there is no SIGALRM (Windows) or off the main thread.
    """
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum, frame):
        raise expired()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))  # 0 would set no timer at all
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
