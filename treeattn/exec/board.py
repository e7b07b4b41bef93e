"""Ranks of one host agreeing on a start instant through shared memory, without a message.

The runner starts every timed run at one instant all ranks agree on (``Comm.release``).
Agreeing by a collective sends messages, and a rank that finished a run early sends them
while the others still run it: the harness then loads the very links and cores it is timing
(with 8 ranks on 2 cores, a 4-byte ping-pong between two of them measured 1.3-1.6 ms while
the six idle ranks' all-reduce ran beside it). Ranks on one host can agree through a small
shared-memory file instead: each writes when it arrived (the worst delay it saw last
time, and whether it was asked to wrap up: ``Comm.release``), sleeps in short naps until
every rank has, and all compute the same instant from the same numbers. A rank that never
arrives makes the others fail at a deadline, never hang; one whose process is gone (killed
with -9 where no launcher takes the group down with it) makes them fail within a fraction of
a second.

Layout: two banks (iteration parity) of one slot per rank, ``(iteration, clock, delay,
stop, check)``; a reader accepts a slot only when its check matches, so a slot read while being
written is read again. A rank can run at most one meeting ahead of the slowest reader (it
cannot pass meeting k + 1 before every rank wrote it), so the other bank is never rewritten
while it is read. After the banks, one ``(pid, start, pid namespace)`` entry per rank, written
when it opens the board (0: not yet, or unknown); a waiting rank checks the missing ranks'
processes every ``_LOOK_S``, where they share its pid namespace.
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct
import time

__all__ = ["HostBoard", "RankExited", "BOARD_DIR"]

BOARD_DIR = "/dev/shm"
_SLOT = struct.Struct("<qdddq")
_BITS = struct.Struct("<ddd")
_WORDS = struct.Struct("<qqq")
_PID = struct.Struct("<qqq")
_NAP_S = 0.0002
"""How long a waiting rank sleeps between looks (short: it decides how late it learns)."""
_LOOK_S = 0.25
"""How often a waiting rank checks that the ranks it waits for still run."""


class RankExited(RuntimeError):
    """A rank the others wait for on the board is no longer running."""


def _identity(pid: int) -> tuple[int, int]:
    """``(start time in clock ticks, pid namespace)`` of a process; 0 for what is unknown
    (no /proc). The start time tells a process from a later one given the same pid."""
    try:
        start = int(_stat(pid)[19])
    except (OSError, IndexError, ValueError):
        start = 0
    try:
        ns = os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        ns = 0
    return start, ns


def _stat(pid: int) -> list[str]:
    """Fields 3 on of /proc/<pid>/stat (after the command name, which may hold spaces)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rpartition(b")")[2].decode().split()


def _gone(pid: int, start: int) -> bool:
    """Whether process ``pid`` (started at ``start``, 0: unknown) has exited."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        fields = _stat(pid)
    except OSError:
        return os.path.isdir("/proc/self")  # where there is a /proc: it exited between the two looks
    # A zombie (exited, not yet reaped by its parent) passes os.kill; another start time is
    # another process that got the pid.
    return fields[0] in ("Z", "X") or (start != 0 and int(fields[19]) != start)


def _check(k: int, clock: float, delay: float, stop: float) -> int:
    a, b, c = _WORDS.unpack(_BITS.pack(clock, delay, stop))
    return (k ^ a ^ (b * 31) ^ (c * 131) ^ 0x5A17) & 0x7FFF_FFFF_FFFF_FFFF


def _size(world: int) -> int:
    return 2 * world * _SLOT.size + world * _PID.size


class HostBoard:
    """One rank's view of the shared board (see the module docstring)."""

    def __init__(self, path: str, rank: int, world: int) -> None:
        self.rank = rank
        self.world = world
        self.path = path
        self._meetings = 0
        fd = os.open(path, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, _size(world))
        finally:
            os.close(fd)
        start, self._ns = _identity(os.getpid())
        _PID.pack_into(self._mm, self._pid_at(rank), os.getpid(), start, self._ns)

    def _pid_at(self, rank: int) -> int:
        return 2 * self.world * _SLOT.size + rank * _PID.size

    def _exited(self, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` whose process is known gone; a rank in another pid namespace (or
        one that has not written its pid) is not judged."""
        out = []
        for r in ranks:
            pid, start, ns = _PID.unpack_from(self._mm, self._pid_at(r))
            if pid > 0 and ns == self._ns and _gone(pid, start):
                out.append(r)
        return out

    @staticmethod
    def new_path() -> str:
        return os.path.join(BOARD_DIR, f"treeattn-board-{os.getpid()}-{secrets.token_hex(8)}")

    @staticmethod
    def create(path: str, world: int) -> None:
        """Make the zeroed board file (rank 0, before the others open it)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, _size(world))
        finally:
            os.close(fd)

    def meet(self, clock: float, delay: float, deadline_s: float, stop: float = 0.0) -> tuple[float, float, float]:
        """Post this rank's ``clock``, ``delay`` and ``stop``; wait for every rank's; return the
        maxima.

        Raises:
            TimeoutError: some rank did not arrive within ``deadline_s`` seconds.
            RankExited: the process of a rank that had not arrived is gone.
        """
        self._meetings += 1
        k = self._meetings
        bank = (k % 2) * self.world
        _SLOT.pack_into(self._mm, (bank + self.rank) * _SLOT.size, k, clock, delay, stop,
                        _check(k, clock, delay, stop))
        give_up = time.monotonic() + deadline_s
        look = time.monotonic() + _LOOK_S
        seen: dict[int, tuple[float, float, float]] = {}

        def look_at_slots() -> None:
            for r in range(self.world):
                if r in seen:
                    continue
                got, c, d, s, check = _SLOT.unpack_from(self._mm, (bank + r) * _SLOT.size)
                if got == k and check == _check(k, c, d, s):
                    seen[r] = (c, d, s)

        while True:
            look_at_slots()
            if len(seen) == self.world:
                clocks, delays, stops = zip(*seen.values(), strict=True)
                return max(clocks), max(delays), max(stops)
            now = time.monotonic()
            if now > look:
                look = now + _LOOK_S
                gone = self._exited(sorted(set(range(self.world)) - set(seen)))
                look_at_slots()  # a rank that posted, then exited after the first look is not missing
                gone = [r for r in gone if r not in seen]
                if gone:
                    who = f"ranks {', '.join(map(str, gone))}" if len(gone) > 1 else f"rank {gone[0]}"
                    raise RankExited(f"{who} exited before the start of run {k} (process gone)")
            if now > give_up:
                missing = sorted(set(range(self.world)) - set(seen))
                raise TimeoutError(f"ranks {missing} did not reach the start of run {k} within {deadline_s:.0f} s")
            time.sleep(_NAP_S)

    def close(self) -> None:
        self._mm.close()
