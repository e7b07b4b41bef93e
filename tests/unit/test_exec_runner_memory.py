"""What the run harness holds besides the plan's own buffers: the correctness check's
temporaries (single process, no torch.distributed)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.rss import can_reset_peak, peak_growth_bytes
from treeattn.exec.reference import FP64_BLOCK_ELEMENTS, Reference
from treeattn.exec.runner import check_against


@pytest.mark.skipif(not can_reset_peak(), reason="needs Linux's /proc/self/clear_refs and VmHWM")
def test_checking_a_raw_result_holds_one_block_of_it():
    # A raw payload's check compares every element; its temporaries would be of the size of
    # the plan's buffers, so it holds one fp64 block (FP64_BLOCK_ELEMENTS), not a copy of the
    # result, an index of every row, or one fp64 temporary per arithmetic step.
    n = 8 << 20  # 32 MiB of fp32
    out = torch.randint(-8, 9, (n,), dtype=torch.int32).float()
    ref = Reference(out.double())
    out[n // 2] += 1.0
    block = FP64_BLOCK_ELEMENTS * 8
    errs = []
    grew = peak_growth_bytes(lambda: errs.append(check_against(out, ref, None, False, raw=True)))
    assert errs[0] == pytest.approx(1 / 8)
    assert grew < 1.5 * block, f"the check grew the resident set by {grew / 2**20:.0f} MiB"
    # A heads layout's rows, given alone or within every row, read as views too.
    assert check_against(out[n // 4:n], ref, (n // 4, n), True, raw=True) == pytest.approx(1 / 8)
    assert check_against(out, ref, (0, n // 4), False, raw=True) == 0.0
    # Every block counts, the last one's last element and a NaN too.
    out[n // 2] -= 1.0
    out[-1] += 2.0
    assert check_against(out, ref, None, False, raw=True) == pytest.approx(2 / 8)
    out[-1] = float("nan")
    assert check_against(out, ref, None, False, raw=True) == math.inf
