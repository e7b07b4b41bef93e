"""Where the Plan IR cuts the rows into chunks (treeattn.plan.ir.chunk_rows, Plan.chunk_range).

A chunk is a row slice of every rank's accumulator, handed to a GPU kernel: the cuts fall where
a row starts at a multiple of 16 bytes, so that a compiled kernel takes it without copying it
(tests/gpu/test_kernels_cuda.py measures that copy on a GPU)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_plan_helpers import CHUNKS, RANKS, every_plan
from treeattn.plan.ir import ROW_ALIGN_BYTES, chunk_rows, row_quantum
from treeattn.workload import RawPayload, Workload


@given(rows=st.integers(0, 300), chunks=st.integers(1, 12), quantum=st.sampled_from([1, 2, 4, 8, 16]),
       first=st.integers(0, 40))
def test_the_chunks_tile_the_rows_and_cut_on_whole_quanta_where_there_are_enough(rows, chunks, quantum, first):
    cuts = [chunk_rows(rows, chunks, c, quantum, first) for c in range(chunks)]
    assert cuts[0][0] == first and cuts[-1][1] == first + rows
    assert all(a <= b for a, b in cuts) and all(cuts[i][1] == cuts[i + 1][0] for i in range(chunks - 1))
    lo, hi = -(-first // quantum) * quantum, (first + rows) // quantum * quantum
    if (hi - lo) // quantum >= chunks:
        inner = [b for _, b in cuts[:-1]]
        assert all(b % quantum == 0 for b in inner)
        # the whole quanta are shared evenly, the first pieces one more
        edges = [lo, *inner, hi]
        quanta = [(b - a) // quantum for a, b in zip(edges, edges[1:], strict=False)]
        assert max(quanta) - min(quanta) <= 1 and quanta == sorted(quanta, reverse=True)
    else:
        sizes = [b - a for a, b in cuts]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_a_quantum_of_one_is_the_near_equal_cut():
    assert [chunk_rows(10, 4, c) for c in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert chunk_rows(10, 4, None, 4, 3) == (3, 13)


@pytest.mark.parametrize(("payload", "quantum"), [
    (Workload(batch=1, q_heads=32, kv_heads=8, head_dim=128, split=(64, 64)), 4),  # rows of 129 fp32
    (Workload(batch=1, q_heads=32, kv_heads=8, head_dim=129, split=(64, 64)), 2),  # 130 fp32
    (Workload(batch=1, q_heads=32, kv_heads=8, head_dim=127, split=(64, 64)), 1),  # 128 fp32
    (RawPayload(nbytes=1 << 20, ranks=2), 4),
    (RawPayload(nbytes=1 << 20, ranks=2, dtype="bf16"), 8),
    (RawPayload(nbytes=1 << 20, ranks=2, dtype="fp8"), 16),
])
def test_the_quantum_is_the_fewest_accumulator_rows_that_make_16_bytes(payload, quantum):
    assert row_quantum(payload) == quantum


def test_a_llama_8b_step_at_b_1_in_3_chunks_cuts_at_16_byte_rows():
    # 32 rows of 516 bytes: the near-equal cut (11, 11, 10) would start two chunks mid-vector
    w = Workload(batch=1, q_heads=32, kv_heads=8, head_dim=128, split=(64, 64))
    assert [chunk_rows(w.rows, 3, c, row_quantum(w)) for c in range(3)] == [(0, 12), (12, 24), (24, 32)]


@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("chunks", CHUNKS)
def test_every_plan_starts_its_chunks_on_16_byte_rows_except_where_a_heads_segment_does_not(p, chunks):
    for plan in every_plan(p, chunks):
        row = plan.workload.acc_row_bytes
        quantum = row_quantum(plan.workload)
        segment_starts = {a for a, _ in plan.segments} if plan.layout == "heads" else {0}
        for c in range(plan.chunks):
            start, stop = plan.chunk_range(c)
            if start in segment_starts:
                continue
            seg = next(s for s in plan.segments if s[0] <= start < s[1]) if plan.layout == "heads" \
                else (0, plan.workload.rows)
            pieces = plan.chunks // plan.ranks if plan.layout == "heads" else plan.chunks
            if seg[1] // quantum - -(-seg[0] // quantum) >= pieces:  # whole quanta enough for every piece
                assert start * row % ROW_ALIGN_BYTES == 0, (plan.algorithm, plan.layout, c, start)
