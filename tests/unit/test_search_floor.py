"""The search's pruning floor: the array form (``_floor_by_step``) against the general one
(``_floor_any``), and the simulator's reading of a plan (send/receive matching)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.test_plan_helpers import attention, every_plan, raw, with_program
from treeattn.cost.program import compile_plan
from treeattn.errors import PlanInvalidError
from treeattn.plan import OpKind
from treeattn.search import Evaluator
from treeattn.search.evaluate import steps_aligned
from treeattn.topology.library import resolve


def _reference_pair(plan) -> dict[tuple[int, int], tuple[int, int]]:
    """The k-th SEND a->b matches the k-th receive at b from a, written out plainly."""
    sends: dict[tuple[int, int], list[tuple[int, int]]] = {}
    recvs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r, prog in enumerate(plan.programs):
        for i, op in enumerate(prog):
            if op.kind is OpKind.SEND:
                sends.setdefault((r, op.peer), []).append((r, i))
            elif op.kind in (OpKind.RECV_MERGE, OpKind.RECV_COPY):
                recvs.setdefault((op.peer, r), []).append((r, i))
    out = {}
    for key, ss in sends.items():
        for s, q in zip(ss, recvs.get(key, ()), strict=False):
            out[s], out[q] = q, s
    return out


@pytest.mark.parametrize("spec", ["dgx-h100", "cpu-4", "emu-2x4", "rtx4090-8"])
@pytest.mark.parametrize("chunks", [1, 3])
def test_array_floor_is_the_general_floor_bit_for_bit(spec, chunks):
    topo = resolve(spec)
    p = topo.num_ranks
    plans = every_plan(p, chunks)
    assert len(plans) > 10
    for payload in (attention(p), raw(p)):
        ev = Evaluator(topo, payload)
        for plan in plans:
            if plan.workload != payload:
                continue
            prog = compile_plan(plan, p, ev._cm)
            partner = prog.pair(p)
            assert steps_aligned(prog, partner), plan.algorithm
            assert ev._floor_by_step(prog, partner) == ev._floor_any(prog, partner), plan.algorithm
            assert ev.floor_us(plan) == ev._floor_any(prog, partner)


def test_a_plan_with_transfers_across_step_numbers_takes_the_general_floor():
    topo = resolve("cpu-4")
    plan = next(pl for pl in every_plan(4, 1) if pl.algorithm == "binomial" and pl.workload == attention(4))
    ev = Evaluator(topo, plan.workload)
    shifted = with_program(plan, 1, [replace(op, step=op.step + 1) for op in plan.programs[1]])
    prog = compile_plan(shifted, 4, ev._cm)
    partner = prog.pair(4)
    assert not steps_aligned(prog, partner)
    assert ev.floor_us(shifted) == ev._floor_any(prog, partner)


@pytest.mark.parametrize("p", [3, 8])
def test_matching_is_kth_send_to_kth_receive(p):
    topo = resolve(f"cpu:ranks={p}")
    for plan in every_plan(p, 3):
        ev = Evaluator(topo, plan.workload)
        prog = compile_plan(plan, p, ev._cm)
        partner = prog.pair(p)
        where = {g: (prog.rank_of[g], g - prog.offset[prog.rank_of[g]]) for g in range(len(prog.kind))}
        got = {where[g]: where[q] for g, q in enumerate(partner) if q >= 0}
        assert got == _reference_pair(plan), plan.algorithm


def test_a_receive_of_another_chunk_is_refused():
    plan = next(pl for pl in every_plan(4, 3) if pl.algorithm == "binomial" and pl.workload == raw(4))
    r, i = next((r, i) for r, prog in enumerate(plan.programs) for i, op in enumerate(prog)
                if op.kind is OpKind.RECV_MERGE)
    ops = list(plan.programs[r])
    ops[i] = replace(ops[i], chunk=(ops[i].chunk + 1) % 3)
    bad = with_program(plan, r, ops)
    ev = Evaluator(resolve("cpu-4"), bad.workload)
    with pytest.raises(PlanInvalidError, match="matches the k-th receive"):
        compile_plan(bad, 4, ev._cm).pair(4)
