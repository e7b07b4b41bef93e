"""The local work the simulator charges a step beyond its merges and copies: the conversions a
rank runs before it posts a step (an exchanged chunk's own slot, the chunks it sends on a narrow
wire) and the end-of-run rounding of copied rows (``treeattn.cost.program``), read from the
same plan functions the executor runs them by (``treeattn.plan.ir``)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.unit.test_cost_helpers import COPY, MERGE, SEND, make_plan, switch_topo
from treeattn.cost.compute import ComputeModel
from treeattn.cost.program import compile_plan, end_rounding, wire_conversions
from treeattn.cost.simulate import simulate
from treeattn.plan.ir import Op, OpKind, collective_kernels, contiguous_runs, wire_converted
from treeattn.workload import Workload

LAUNCH = 7.0
MEM_GBPS = 100.0


def _topo(p: int):
    return switch_topo(p, launch=LAUNCH, mem_bw=MEM_GBPS)


def _work(p: int, dtype: str, rows_per_head: int = 1) -> Workload:
    return Workload(batch=rows_per_head, q_heads=8, kv_heads=2, head_dim=64, split=(64,) * p, partial_dtype=dtype)


def _compute() -> Op:
    return Op(OpKind.COMPUTE, 0)


@pytest.mark.parametrize(("spans", "runs"), [
    ([], ()),
    ([(4, 8), (0, 4)], ((0, 8),)),                    # touching, in any order
    ([(0, 4), (6, 8)], ((0, 4), (6, 8))),             # a gap keeps two runs
    ([(0, 8), (2, 4), (8, 9)], ((0, 9),)),            # inside and touching
    ([(3, 3), (0, 2)], ((0, 2), (3, 3))),             # an empty range keeps its place
])
def test_contiguous_runs_join_touching_and_overlapping_ranges(spans, runs):
    assert contiguous_runs(spans) == runs


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_an_exchange_pays_its_own_slot_before_it_posts(dtype):
    """Two ranks exchange their partials (direct): each converts its own into the stack it
    merges from, one kernel (two on a narrow wire), before the exchange is posted."""
    topo = _topo(2)
    w = _work(2, dtype)
    progs = [[_compute(), Op(SEND, 1, peer=1), Op(MERGE, 1, peer=1)],
             [_compute(), Op(SEND, 1, peer=0), Op(MERGE, 1, peer=0)]]
    plan = make_plan(progs, w, topo)
    acc_row = (w.head_dim + 1) * 4
    moved, kernels = wire_conversions(plan, progs[0][1:])
    assert (moved, kernels) == (w.rows * (acc_row + w.row_bytes), 1 if dtype == "fp32" else 2)
    cm = ComputeModel.of(w, topo)
    prog = compile_plan(plan, 2, cm)
    # Charged at the end of the step before (the compute), so the exchange posts after it.
    assert prog.merge_b[0] == [moved, 3 * w.payload_bytes]
    assert prog.merge_k[0] == [kernels, 1]  # bf16 at D = 64: the merge reads the stack's lse in place
    res = simulate(plan, topo)
    by = {(t.rank, t.op): t for t in res.timeline}
    convert = cm.step_local_us(0, moved, kernels)
    assert math.isclose(by[(0, 1)].start_us, by[(0, 0)].end_us + convert, rel_tol=1e-12)


def test_narrow_wire_sends_pay_two_kernels_per_contiguous_run_once_however_many_peers():
    topo = _topo(4)
    w = _work(4, "bf16", rows_per_head=4)  # 32 rows in 4 chunks of 8
    sends = [Op(SEND, 1, peer=1, chunk=0), Op(SEND, 1, peer=2, chunk=1), Op(SEND, 1, peer=3, chunk=0),
             Op(SEND, 1, peer=1, chunk=3)]
    plan = make_plan([[_compute(), *sends]] + [[_compute()]] * 3, w, topo, chunks=4, result_ranks=[0])
    assert wire_converted(plan, sends, set()) == (0, 1, 3)
    acc_row = (w.head_dim + 1) * 4
    # chunks 0 and 1 are one run of 16 rows, chunk 3 another of 8.
    assert wire_conversions(plan, sends) == (24 * (acc_row + w.row_bytes), 4)
    fp32 = dataclasses.replace(plan, workload=_work(4, "fp32", rows_per_head=4))
    assert wire_conversions(fp32, sends) == (0, 0)


def test_copied_rows_are_rounded_at_the_end_on_every_rank_of_a_narrow_wire():
    """Rank 0 reduces and sends chunk 1 back as a copy: on a bf16 wire every rank rounds
    chunk 1's rows at the end, two kernels, charged on its last step."""
    topo = _topo(2)
    w = _work(2, "bf16", rows_per_head=2)  # 16 rows in 2 chunks of 8
    progs = [[_compute(), Op(MERGE, 1, peer=1, chunk=1), Op(SEND, 2, peer=1, chunk=1)],
             [_compute(), Op(SEND, 1, peer=0, chunk=1), Op(COPY, 2, peer=0, chunk=1)]]
    plan = make_plan(progs, w, topo, chunks=2)
    assert plan.rounded_runs == ((8, 16),)
    moved, kernels = end_rounding(plan)
    assert (moved, kernels) == (8 * w.head_dim * 2 * (4 + 2), 2)
    cm = ComputeModel.of(w, topo)
    prog = compile_plan(plan, 2, cm)
    # Rank 1: its step-1 send converts chunk 1 (charged on step 0); its last step copies
    # (twice the message: o and the lse's bytes, two kernels) and rounds.
    send_moved, send_kernels = wire_conversions(plan, progs[1][1:2])
    assert prog.merge_b[1] == [send_moved, 0, 2 * 8 * w.row_bytes + moved]
    assert prog.merge_k[1] == [send_kernels, 0, 2 + kernels]
    assert make_plan(progs, _work(2, "fp32", rows_per_head=2), topo, chunks=2).rounded_runs == ()


@pytest.mark.parametrize(("dtype", "extra"), [("fp32", 0), ("bf16", 0), ("fp8", 1)])
def test_an_fp8_reduction_pays_its_conversions_to_fp32(dtype, extra):
    """No library reduces fp8: the Comm reduces an fp32 copy, one kernel for each call that
    carries fp8 (the sum of (w o, w), finished from the fp32 sum; the max of the lse is fp32
    anyway); a raw payload's sum is copied back too, two (``test_exec_local_kernels``)."""
    topo = _topo(2)
    coll = Op(OpKind.COLLECTIVE, 1, coll="allreduce", reduce="merge", part="partial")
    plan = make_plan([[_compute(), coll]] * 2, _work(2, dtype), topo)
    assert collective_kernels(plan, coll) == 3 + extra
