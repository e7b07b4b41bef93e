"""Signals around work that must clean up after itself: turned into ``KeyboardInterrupt``
while the work runs (so ``finally`` blocks run), held while the cleanup runs (so a second
Ctrl-C, or ``timeout`` signalling the process and then its group, cannot cut it short)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

__all__ = ["Signalled", "WRAP_UP_SIGNAL", "WrapUp", "before_hard_exit", "ended_if_stuck", "exit_status", "forget",
           "hard_exit", "interrupts_raise", "raise_interrupt", "shielded", "stopping_signals", "wrap_up_on_signals"]

_received: int | None = None
"""The last signal ``raise_interrupt`` turned into an interrupt (None: none since ``forget``)."""


class Signalled(KeyboardInterrupt):
    """The KeyboardInterrupt a signal raises here; ``signum`` says which (its text: SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


_handled_at = float("-inf")
"""When (``time.monotonic``) ``raise_interrupt`` or ``shielded`` last ran for a stopping signal
(``ended_if_stuck``)."""


def raise_interrupt(signum, frame) -> None:  # noqa: ANN001, ARG001 - signal handler signature
    """Signal handler: note the signal and raise ``Signalled`` (a KeyboardInterrupt)."""
    global _received, _handled_at  # noqa: PLW0603 - the CLI reads it after typer has swallowed the exception
    _received = int(signum)
    _handled_at = time.monotonic()
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
    """``others`` and SIGHUP, less those this process ignores: the signals a command turns into
    an interrupt. An ignored one stays ignored: SIGHUP under ``nohup``, which must outlive its
    terminal; SIGINT in a job a non-interactive shell started in the background, which the
    shell keeps from the Ctrl-C meant for what runs in front."""
    return tuple(s for s in (*others, signal.SIGHUP) if signal.getsignal(s) is not signal.SIG_IGN)


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into KeyboardInterrupt while inside, so ``finally``
    blocks run; does nothing outside the main thread. One the process ignores stays ignored
    (``stopping_signals``): stop such a job with SIGTERM."""
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
        global _handled_at  # noqa: PLW0603
        _handled_at = time.monotonic()
        held.append(signum)

    # An ignored signal stays ignored (nohup's SIGHUP): held, it would be raised to no one after.
    old = {s: signal.signal(s, hold) for s in stopping_signals((signal.SIGINT, signal.SIGTERM))}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if held and not unwinding:  # also where the body raised (a fork that failed): the signal wins
            signal.raise_signal(held[0])


WRAP_UP_SIGNAL = signal.SIGUSR1
"""What a local launcher sends its ranks to have them wrap up (``WrapUp``): unlike the stopping
signals it never stops at once, so a rank that also gets the terminal's Ctrl-C, or the same
request twice, counts one request."""
SAME_REQUEST_S = 2.0
"""Stopping signals this soon after the first count as that one request (``WrapUp``): a terminal's
Ctrl-C reaches a rank and its launcher, which passes it on (torchrun as SIGTERM); ``timeout``
signals a process, then its group."""


class WrapUp:
    """A request to end work at its next safe point rather than at once (``wrap_up_on_signals``):
    ``signum`` is the first signal that asked (None: none yet). Until ``keeping`` is set (the
    work has begun what it would keep) a signal stops at once, as under ``interrupts_raise``;
    after, a stopping signal more than ``SAME_REQUEST_S`` after the first stops at once, as a
    second Ctrl-C does. ``stuck_grace_s``: how long ``ended_if_stuck`` waits for the handler
    while keeping (the main thread may wait inside a collective that the work's own deadlines
    bound)."""

    def __init__(self, keeping: bool = True) -> None:
        self.signum: int | None = None
        self.at = float("-inf")
        self.keeping = keeping
        self.stuck_grace_s = STUCK_GRACE_S

    def handle(self, signum, frame) -> None:  # noqa: ANN001 - signal handler signature
        global _handled_at  # noqa: PLW0603 - ended_if_stuck reads it: the handler ran
        now = time.monotonic()
        _handled_at = now
        if not self.keeping:
            raise_interrupt(signum, frame)
        if self.signum is None:
            self.signum, self.at = int(signum), now
        elif signum != WRAP_UP_SIGNAL and now - self.at > SAME_REQUEST_S:
            raise_interrupt(signum, frame)


_active: WrapUp | None = None
"""The ``WrapUp`` of the ``wrap_up_on_signals`` a process is inside (None: none)."""


@contextlib.contextmanager
def wrap_up_on_signals(keeping: bool = True) -> Iterator[WrapUp]:
    """While inside, ``WRAP_UP_SIGNAL`` and the stopping signals (SIGINT, SIGTERM, SIGHUP, less
    those ignored) go to the ``WrapUp`` yielded: stop at once until it is ``keeping``, then note
    a request to wrap up. Inside another, it is the outer one's (one request a process), made
    ``keeping`` where this one is. Off the main thread nothing is installed and no request
    comes."""
    global _active  # noqa: PLW0603
    if _active is not None:
        _active.keeping = _active.keeping or keeping
        yield _active
        return
    wrap = WrapUp(keeping)
    if threading.current_thread() is not threading.main_thread():
        yield wrap
        return
    wanted = (*stopping_signals((signal.SIGINT, signal.SIGTERM)), WRAP_UP_SIGNAL)
    old = {s: signal.signal(s, wrap.handle) for s in wanted}
    _active = wrap
    try:
        yield wrap
    finally:
        _active = None
        for s, handler in old.items():
            signal.signal(s, handler)


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


def _drained(fd: int) -> bool:
    """Read ``fd`` empty without waiting; False where it has ended (its writer closed)."""
    os.set_blocking(fd, False)
    try:
        while True:
            try:
                if not os.read(fd, 64):
                    return False
            except BlockingIOError:
                return True
            except OSError:
                return False
    finally:
        with contextlib.suppress(OSError):
            os.set_blocking(fd, True)


STUCK_GRACE_S = 2.0
"""How long a stopping signal may wait for the main thread to run its handler (``ended_if_stuck``)."""
_STOPPING = frozenset((signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


@contextlib.contextmanager
def ended_if_stuck(grace_s: float = STUCK_GRACE_S) -> Iterator[None]:
    """While inside, a stopping signal (SIGINT, SIGTERM, SIGHUP) whose handler the main thread
    has not run within ``grace_s`` ends the process: "aborted" on stderr, the cleanups of
    ``before_hard_exit``, then status 128 + the signal. Python runs a handler between bytecodes
    only, and a main thread waiting inside a C++ call (torch's store, gloo's connection of the
    ranks, a collective) would otherwise keep a launcher's SIGTERM waiting for that call's
    timeout: the deadline, minutes (the default action, before handlers were set, ended the
    process at once, silently). The signal is seen at once through ``signal.set_wakeup_fd``,
    by a thread. Does nothing outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    err = os.dup(2)  # stderr as it is now: a rank's set-up holds fd 2 (exec.launch)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            # A signal read now came after this instant, and so does its handler's run.
            ready = time.monotonic()
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:
                return
            stopping = [b for b in data if b in _STOPPING]
            if not stopping:
                continue
            # a command keeping what it did waits as long as its work's deadlines allow
            wait_s = max(grace_s, _active.stuck_grace_s) if _active is not None and _active.keeping else grace_s
            deadline = time.monotonic() + wait_s
            while _handled_at < ready and time.monotonic() < deadline:
                time.sleep(0.02)
            if _handled_at < ready:
                with contextlib.suppress(OSError):
                    os.write(err, b"aborted\n")
                hard_exit(128 + stopping[0])
            # Signals that came while the main thread was busy in C ran one handler between them:
            # their bytes, there now, are that run's.
            if not _drained(r):
                return

    watcher = threading.Thread(target=watch, name="treeattn-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(w)  # the watcher reads the end and returns
        watcher.join(grace_s + 1.0)
        os.close(r)
        os.close(err)
