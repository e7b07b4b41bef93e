"""Ranks of one host agreeing on a start instant through shared memory, without a message.

The runner starts every timed run at one instant all ranks agree on (``Comm.release``).
Agreeing by a collective sends messages, and a rank that finished a run early sends them
while the others still run it: the harness then loads the very links and cores it is timing
(with 8 ranks on 2 cores, a 4-byte ping-pong between two of them measured 1.3-1.6 ms while
the six idle ranks' all-reduce ran beside it). Ranks on one host can agree through a small
shared-memory file instead: each writes when it arrived (and the worst delay it saw last
time), sleeps in short naps until every rank has, and all compute the same instant from the
same numbers. A rank that never arrives makes the others fail at a deadline, never hang.

Layout: two banks (iteration parity) of one slot per rank, ``(iteration, clock, delay,
check)``; a reader accepts a slot only when its check matches, so a slot read while being
written is read again. A rank can run at most one meeting ahead of the slowest reader (it
cannot pass meeting k + 1 before every rank wrote it), so the other bank is never rewritten
while it is read.
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct
import time

__all__ = ["HostBoard", "BOARD_DIR"]

BOARD_DIR = "/dev/shm"
_SLOT = struct.Struct("<qddq")
_BITS = struct.Struct("<dd")
_WORDS = struct.Struct("<qq")
_NAP_S = 0.0002
"""How long a waiting rank sleeps between looks (short: it decides how late it learns)."""


def _check(k: int, clock: float, delay: float) -> int:
    a, b = _WORDS.unpack(_BITS.pack(clock, delay))
    return (k ^ a ^ (b * 31) ^ 0x5A17) & 0x7FFF_FFFF_FFFF_FFFF


class HostBoard:
    """One rank's view of the shared board (see the module docstring)."""

    def __init__(self, path: str, rank: int, world: int) -> None:
        self.rank = rank
        self.world = world
        self.path = path
        self._meetings = 0
        fd = os.open(path, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, 2 * world * _SLOT.size)
        finally:
            os.close(fd)

    @staticmethod
    def new_path() -> str:
        return os.path.join(BOARD_DIR, f"treeattn-board-{os.getpid()}-{secrets.token_hex(8)}")

    @staticmethod
    def create(path: str, world: int) -> None:
        """Make the zeroed board file (rank 0, before the others open it)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, 2 * world * _SLOT.size)
        finally:
            os.close(fd)

    def meet(self, clock: float, delay: float, deadline_s: float) -> tuple[float, float]:
        """Post this rank's ``clock`` and ``delay``; wait for every rank's; return the maxima.

        Raises:
            TimeoutError: some rank did not arrive within ``deadline_s`` seconds.
        """
        self._meetings += 1
        k = self._meetings
        bank = (k % 2) * self.world
        _SLOT.pack_into(self._mm, (bank + self.rank) * _SLOT.size, k, clock, delay, _check(k, clock, delay))
        give_up = time.monotonic() + deadline_s
        seen: dict[int, tuple[float, float]] = {}
        while True:
            for r in range(self.world):
                if r in seen:
                    continue
                got, c, d, check = _SLOT.unpack_from(self._mm, (bank + r) * _SLOT.size)
                if got == k and check == _check(k, c, d):
                    seen[r] = (c, d)
            if len(seen) == self.world:
                return max(c for c, _ in seen.values()), max(d for _, d in seen.values())
            if time.monotonic() > give_up:
                missing = sorted(set(range(self.world)) - set(seen))
                raise TimeoutError(f"ranks {missing} did not reach the start of run {k} within {deadline_s:.0f} s")
            time.sleep(_NAP_S)

    def close(self) -> None:
        self._mm.close()
