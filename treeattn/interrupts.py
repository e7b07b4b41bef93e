"""Signals around work that must clean up after itself: turned into ``KeyboardInterrupt``
while the work runs (so ``finally`` blocks run), ignored while the cleanup runs (so a second
Ctrl-C, or ``timeout`` signalling the process and then its group, cannot cut it short)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["interrupts_raise", "shielded"]


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into KeyboardInterrupt while inside, so ``finally``
    blocks run; does nothing outside the main thread. SIGINT too: a process started in the
    background of a non-interactive shell inherits it ignored, and Python then leaves it so."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM/SIGHUP while cleaning up, so a second Ctrl-C cannot cut it short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
