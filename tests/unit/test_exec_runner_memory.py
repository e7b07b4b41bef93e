"""What the run harness holds besides the plan's own buffers: the correctness check's
temporaries (single process, no torch.distributed)."""

from __future__ import annotations

import pytest
import torch

from tests.rss import can_reset_peak, peak_growth_bytes
from treeattn.exec.reference import Reference
from treeattn.exec.runner import check_against


@pytest.mark.skipif(not can_reset_peak(), reason="needs Linux's /proc/self/clear_refs and VmHWM")
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
    grew = peak_growth_bytes(lambda: errs.append(check_against(out, ref, None, False, raw=True)))
    assert errs[0] == pytest.approx(1 / 8)
    assert grew < 1.5 * fp64, f"the check grew the resident set by {grew / 2**20:.0f} MiB"
    # A heads layout's rows, given alone or within every row, read as views too.
    assert check_against(out[n // 4:n], ref, (n // 4, n), True, raw=True) == pytest.approx(1 / 8)
    assert check_against(out, ref, (0, n // 4), False, raw=True) == 0.0
