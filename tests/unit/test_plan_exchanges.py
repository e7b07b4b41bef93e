"""The one-pass reading of a rank's step (``step_transfers``) that ``exchanged_chunks``,
``stacked_exchanges`` and the simulator's conversions (``cost.program``) share, against the
rules written out plainly, on every step of every builder's plans."""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby

import pytest

from tests.unit.test_plan_helpers import attention, every_plan
from treeattn.cost.program import wire_conversions
from treeattn.plan.ir import OpKind, Plan, contiguous_runs, exchanged_chunks, stacked_exchanges, wire_converted


def _exchanged(ops) -> set:
    if any(op.kind is OpKind.COMPUTE for op in ops):
        return set()
    sent, merged = {}, {}
    for op in ops:
        if op.kind is OpKind.SEND and op.block is None:
            sent.setdefault(op.chunk, []).append(op.peer)
        elif op.kind is OpKind.RECV_MERGE:
            merged.setdefault(op.chunk, []).append(op.peer)
    return {c for c, peers in merged.items()
            if len(set(peers)) == len(peers) and sorted(peers) == sorted(sent.get(c, []))}


def _stacked(plan: Plan, ops) -> set:
    exchanged = _exchanged(ops)
    received = [op.chunk for op in ops if op.kind is OpKind.RECV_MERGE]
    return {c for c in exchanged if not plan.is_raw or received.count(c) >= 2}


def _conversions(plan: Plan, ops) -> tuple[int, int]:
    w = plan.workload
    stacked = _stacked(plan, ops)
    moved = kernels = 0
    for c in stacked:
        start, stop = plan.chunk_range(c)
        moved += (stop - start) * (w.acc_row_bytes + w.row_bytes)
        kernels += 2 if plan.narrow_wire else 1
    for start, stop in contiguous_runs(plan.chunk_range(c) for c in wire_converted(plan, ops, stacked)):
        moved += (stop - start) * (w.acc_row_bytes + w.row_bytes)
        kernels += 2
    return moved, kernels


@pytest.mark.parametrize("p", [4, 5, 8])
@pytest.mark.parametrize("chunks", [1, 3])
def test_a_step_read_in_one_pass_is_the_plain_rules(p, chunks):
    plans = every_plan(p, chunks)
    plans += [replace(pl, workload=replace(pl.workload, partial_dtype="bf16")) for pl in plans
              if pl.workload == attention(p)]
    steps = 0
    for plan in plans:
        for prog in plan.programs:
            for _, group in groupby(prog, key=lambda op: op.step):
                ops = list(group)
                assert exchanged_chunks(ops) == _exchanged(ops), plan.algorithm
                assert exchanged_chunks(iter(ops)) == _exchanged(ops), plan.algorithm
                assert stacked_exchanges(plan, ops) == _stacked(plan, ops), plan.algorithm
                assert wire_conversions(plan, ops) == _conversions(plan, ops), plan.algorithm
                steps += 1
    assert steps > 100
