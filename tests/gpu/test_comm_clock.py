"""``Comm``'s clock on CUDA: marks read in host seconds from an ``origin`` are never earlier
than the host instant they were recorded at (the device passes a mark after its record)."""

from __future__ import annotations

import time

import torch

from treeattn.exec.comm import Comm


def test_a_mark_reads_no_earlier_than_its_record():
    comm = Comm(0, 1, "nccl", torch.device("cuda", 0), 5.0, 5.0)
    torch.cuda.synchronize()
    for _ in range(20):
        before = time.perf_counter()
        origin = comm.origin()
        time.sleep(0.001)
        recorded = time.perf_counter()
        end = comm.mark()
        end.synchronize()
        after = time.perf_counter()
        # A clock read before the origin's record counted every mark early by the record's
        # latency: `recorded` could come out later than the mark itself.
        assert before <= origin[0] <= after
        assert comm.seconds(end, origin) >= recorded - 1e-6  # 1 us: the events' resolution is 0.5
