"""Deadlines on work the device runs after the host has moved on (CUDA).

A CUDA wait does not hold the host: the device waits, and a marker (an event recorded on the
stream after the wait) says where. Markers of one stream pass in the order they were
recorded, so the last of a list having passed means every one did: a check queries the
newest marker first and walks the list only to name the operation that did not pass in time.

``Outstanding`` holds the markers of the calls (a ``Merger``'s) issued and not yet seen
finished. ``check`` never sleeps while at most ``bound`` calls are outstanding: it queries
the oldest calls until one has not finished, and raises when that one has been seen
unfinished for longer than the deadline. The deadline of a call counts from when the host
first saw it unfinished with every call before it finished, so a call queued behind
another does not age while that one runs (as ``wait_marks``' markers each count from the
one before). With more than ``bound`` outstanding, ``check`` waits for the oldest (within
its deadline): a host that has run ahead of a hung device stops there and raises within
about the deadline, and what is held stays bounded.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from treeattn.errors import InputError

SETUP_TIMEOUT_S = 120.0
"""How long connecting the ranks and opening their communicators may take (``RunOptions``)."""

LONGEST_TIMEOUT_S = 1e9
"""The longest set-up or operation timeout a Comm takes (seconds; 31 years): torch's C++ adds a
timeout to a clock in int64 nanoseconds, which about 9.2e9 s overflows (gloo's waits then time
out at once or hang: measured from 9e9 s on), and a timedelta holds no more than 8.6e13 s;
inf ('no timeout') included."""

MAX_ITERATIONS = 1_000_000
"""Most timed (or warm-up) runs of one method or case (``--repeats``, ``--warmup``): a run keeps
every timed run's times and builds its schedule up front, so a count without bound would fill
memory before the first run."""

__all__ = ["POLL_S", "SETUP_TIMEOUT_S", "LONGEST_TIMEOUT_S", "MAX_ITERATIONS", "Call", "Outstanding",
           "check_iterations", "first_pending", "wait_marks"]

POLL_S = 2e-5
"""How long a blocking wait sleeps between queries (a sleep lasts longer: tens of µs)."""

Marks = list[tuple[Any, str]]
"""Markers in stream order, each something with ``query()`` (a CUDA event) and what it marks."""


def check_iterations(repeats: int, warmup: int | None = None, where: str = "") -> None:
    """Refuse a timed count outside 1 to ``MAX_ITERATIONS`` or a warm-up count outside 0 to
    ``MAX_ITERATIONS`` (None: no warm-up count to check). ``where`` says whose counts they are
    (``"of 'p'"``). The options classes of run, calibrate and validate call it when built, so a
    count the run could not hold is refused before anything is launched."""
    if 1 <= repeats <= MAX_ITERATIONS and (warmup is None or 0 <= warmup <= MAX_ITERATIONS):
        return
    of = f" {where}" if where else ""
    if warmup is None:
        raise InputError(f"repeats{of} must be 1 to {MAX_ITERATIONS}, got {repeats}")
    raise InputError(f"repeats{of} must be 1 to {MAX_ITERATIONS} and warmup 0 to {MAX_ITERATIONS}, "
                     f"got {repeats} and {warmup}")


def first_pending(marks: Marks) -> str:
    """What the first marker the device has not passed marks (the last one's, if all passed since)."""
    return next((what for mark, what in marks if not mark.query()), marks[-1][1])


def wait_marks(marks: Marks, limit_s: float, fail: Callable[[str], Exception],
               clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep) -> None:
    """Block until the device has passed every marker, each within ``limit_s`` of the one
    before (the first: of the call); raise ``fail(what)`` for the first one it did not pass."""
    if not marks or marks[-1][0].query():
        return
    last = clock()
    for mark, what in marks:
        while not mark.query():
            if clock() - last > limit_s:
                raise fail(what)
            sleep(POLL_S)
        last = clock()


@dataclass(slots=True)
class Call:
    """One call's markers, and when the host first saw it unfinished (the oldest such only)."""

    marks: Marks
    replay: str | None = None
    """A CUDA graph replay's name: its markers inside the graph are recorded again by every
    replay, so while a later replay is outstanding they cannot say which op this one is on."""
    since: float | None = None


class Outstanding:
    """Calls whose device work the host has not seen finish (see the module docstring).

    Args:
        limit_s: the deadline of a call.
        bound: how many calls may be outstanding after ``check``.
        fail: the exception for a call that missed its deadline, given what it names.
    """

    def __init__(self, limit_s: float, bound: int, fail: Callable[[str], Exception],
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.limit_s = limit_s
        self.bound = bound
        self._fail = fail
        self._clock = clock
        self._sleep = sleep
        self._calls: deque[Call] = deque()

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, marks: Marks, replay: str | None = None) -> None:
        """A call just issued, with its markers in stream order (none: nothing to wait for)."""
        if marks:
            self._calls.append(Call(marks, replay))

    def check(self) -> None:
        """Forget the finished calls; raise if the oldest unfinished one is past its deadline;
        wait for the oldest while more than ``bound`` are outstanding."""
        now = self._clock()
        while self._calls:
            call = self._calls[0]
            if call.marks[-1][0].query():
                self._calls.popleft()
                continue
            if call.since is None:
                call.since = now
            elif now - call.since > self.limit_s:
                raise self._timed_out(call)
            break
        while len(self._calls) > self.bound:
            self._wait_oldest()

    def drain(self) -> None:
        """Wait until every outstanding call has finished, each within its deadline."""
        while self._calls:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        call = self._calls[0]
        if call.since is None:
            call.since = self._clock()
        while not call.marks[-1][0].query():
            if self._clock() - call.since > self.limit_s:
                raise self._timed_out(call)
            self._sleep(POLL_S)
        self._calls.popleft()

    def _timed_out(self, call: Call) -> Exception:
        again = sum(c is not call and c.replay == call.replay for c in self._calls) if call.replay else 0
        if again:
            return self._fail(f"{call.replay} (a CUDA graph replay; which of its ops is not known: "
                              f"{again} later call(s) replayed it again)")
        return self._fail(first_pending(call.marks))
