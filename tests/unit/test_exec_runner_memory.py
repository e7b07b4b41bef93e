"""What the run harness holds besides the plan's own buffers: the correctness check's
temporaries and the kept results (single process, no torch.distributed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from treeattn.exec.reference import Reference
from treeattn.exec.runner import check_against

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _rss_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def _peak_growth_bytes(fn) -> int:  # noqa: ANN001 - a callable
    """How far the resident set rose above where it stood while ``fn`` ran (Linux: VmHWM
    reset through clear_refs)."""
    _CLEAR.write_text("5")
    before = _rss_kib("VmRSS")
    fn()
    return (_rss_kib("VmHWM") - before) * 1024


def _can_reset_peak() -> bool:
    try:
        _CLEAR.write_text("5")
        _rss_kib("VmHWM")
    except (OSError, LookupError):
        return False
    return True


@pytest.mark.skipif(not _can_reset_peak(), reason="needs Linux's /proc/self/clear_refs and VmHWM")
def test_checking_a_raw_result_copies_it_once():
    # A raw payload's check compares every element; its temporaries are of the size of the
    # plan's buffers, so it must hold one fp64 copy of the result, not an index of every row,
    # a gathered copy, and one fp64 temporary per arithmetic step (nine times the buffer).
    n = 8 << 20  # 32 MiB of fp32
    out = torch.randint(-8, 9, (n,), dtype=torch.int32).float()
    ref = Reference(out.double())
    out[n // 2] += 1.0
    fp64 = n * 8
    errs = []
    grew = _peak_growth_bytes(lambda: errs.append(check_against(out, ref, None, False, raw=True)))
    assert errs[0] == pytest.approx(1 / 8)
    assert grew < 1.5 * fp64, f"the check grew the resident set by {grew / 2**20:.0f} MiB"
    # A heads layout's rows, given alone or within every row, read as views too.
    assert check_against(out[n // 4:n], ref, (n // 4, n), True, raw=True) == pytest.approx(1 / 8)
    assert check_against(out, ref, (0, n // 4), False, raw=True) == 0.0
