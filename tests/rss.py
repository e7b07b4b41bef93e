"""A process's peak resident memory around a call (Linux ``/proc``), for tests that bound
what a kernel or a check holds at once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _rss_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def peak_growth_bytes(fn: Callable[[], object]) -> int:
    """How far the resident set rose above where it stood while ``fn`` ran (VmHWM, reset
    through clear_refs)."""
    _CLEAR.write_text("5")
    before = _rss_kib("VmRSS")
    fn()
    return (_rss_kib("VmHWM") - before) * 1024


def peak_bytes() -> int:
    """This process's peak resident set so far (VmHWM)."""
    return _rss_kib("VmHWM") * 1024


def can_reset_peak() -> bool:
    """Whether this system lets a process reset and read its peak (Linux's clear_refs, VmHWM)."""
    try:
        _CLEAR.write_text("5")
        _rss_kib("VmHWM")
    except (OSError, LookupError):
        return False
    return True
