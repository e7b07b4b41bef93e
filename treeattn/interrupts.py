"""Signals around work that must clean up after itself: turned into ``KeyboardInterrupt``
while the work runs (so ``finally`` blocks run), held while the cleanup runs (so a second
Ctrl-C, or ``timeout`` signalling the process and then its group, cannot cut it short)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

__all__ = ["Signalled", "before_hard_exit", "exit_status", "forget", "hard_exit", "interrupts_raise", "raise_interrupt",
           "shielded", "stopping_signals"]

_received: int | None = None
"""The last signal ``raise_interrupt`` turned into an interrupt (None: none since ``forget``)."""


class Signalled(KeyboardInterrupt):
    """The KeyboardInterrupt a signal raises here; ``signum`` says which (its text: SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def raise_interrupt(signum, frame) -> None:  # noqa: ANN001, ARG001 - signal handler signature
    """Signal handler: note the signal and raise ``Signalled`` (a KeyboardInterrupt)."""
    global _received  # noqa: PLW0603 - the CLI reads it after typer has swallowed the exception
    _received = int(signum)
    raise Signalled(signum)


def forget() -> None:
    """Forget the signal noted last (the CLI calls it as a command starts)."""
    global _received  # noqa: PLW0603
    _received = None


def exit_status(exc: BaseException | None = None) -> int:
    """The shell's status for a command ended by an interrupt: 128 + the signal (SIGINT 130,
    SIGTERM 143, SIGHUP 129), as batch systems and ``timeout`` read it. ``exc``: the interrupt
    caught (a plain KeyboardInterrupt is Ctrl-C's, 130); None: the signal noted last, else 130."""
    if exc is not None:
        return 128 + getattr(exc, "signum", signal.SIGINT)
    return 128 + (_received or signal.SIGINT)


def stopping_signals(others: tuple[int, ...] = (signal.SIGTERM,)) -> tuple[int, ...]:
    """``others`` and SIGHUP, unless SIGHUP is ignored (a process started by ``nohup``, which
    must outlive its terminal): the signals a command turns into an interrupt."""
    hup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (*others, *hup)


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into KeyboardInterrupt while inside, so ``finally``
    blocks run; does nothing outside the main thread. SIGINT too: a process started in the
    background of a non-interactive shell inherits it ignored, and Python then leaves it so.
    An ignored SIGHUP stays ignored: ``nohup`` asked for that (``stopping_signals``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    old = {s: signal.signal(s, raise_interrupt) for s in stopping_signals((signal.SIGINT, signal.SIGTERM))}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP while cleaning up, so a second Ctrl-C cannot cut it short.

    Where an exception unwinds as the cleanup starts (the cleanup in a ``finally``, after an
    interrupt), a signal held is the second and is dropped. Where none does (the cleanup after
    work that ended), it is the first: it is raised again once the cleanup is done and the
    handlers are back, so the process stops as it would have, after the cleanup, instead of
    going on as if nothing was sent."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    unwinding = sys.exc_info()[1] is not None
    held: list[int] = []

    def hold(signum, frame) -> None:  # noqa: ANN001, ARG001 - signal handler signature
        held.append(signum)

    old = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if held and not unwinding:
        signal.raise_signal(held[0])


_ON_HARD_EXIT: list[Callable[[], None]] = []
"""Cleanups ``hard_exit`` runs (``before_hard_exit``), last registered first."""


@contextlib.contextmanager
def before_hard_exit(cleanup: Callable[[], None]) -> Iterator[None]:
    """Have ``hard_exit`` call ``cleanup`` while inside: where the process must end from another
    thread, its ``finally`` blocks do not run."""
    _ON_HARD_EXIT.append(cleanup)
    try:
        yield
    finally:
        _ON_HARD_EXIT.remove(cleanup)


def hard_exit(status: int) -> NoReturn:
    """End the process now with ``status``, from any thread (the main one may be stuck in a C++
    call no signal interrupts), after the cleanups registered with ``before_hard_exit``."""
    for cleanup in reversed(list(_ON_HARD_EXIT)):
        with contextlib.suppress(Exception):
            cleanup()
    os._exit(status)
