"""The validator: each kind of violation on a hand-made plan, and mutations of built plans."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_plan_helpers import REF, attention, every_plan, op_indices, raw, split_step, with_program
from treeattn.errors import PlanInvalidError
from treeattn.plan import ALGORITHMS, Op, OpKind, Plan, ViolationKind, build, check, tree_plan, validate
from treeattn.plan.steps import NEVER_BREAK, step_problem

V = ViolationKind


def C(step: int, block: int | None = None) -> Op:
    return Op(OpKind.COMPUTE, step, block=block)


def S(step: int, peer: int, chunk: int | None = None, block: int | None = None) -> Op:
    return Op(OpKind.SEND, step, peer=peer, chunk=chunk, block=block)


def M(step: int, peer: int, chunk: int | None = None) -> Op:
    return Op(OpKind.RECV_MERGE, step, peer=peer, chunk=chunk)


def K(step: int, peer: int, chunk: int | None = None, block: int | None = None) -> Op:
    return Op(OpKind.RECV_COPY, step, peer=peer, chunk=chunk, block=block)


def A(step: int, reduce: str, part: str, coll: str = "allreduce", chunk: int | None = None) -> Op:
    return Op(OpKind.COLLECTIVE, step, coll=coll, reduce=reduce, part=part, chunk=chunk)


def hand(programs: list[list[Op]], *, is_raw: bool = False, chunks: int = 1, result=None,
         contributors=None, layout: str = "full") -> Plan:
    p = len(programs)
    return Plan(algorithm="hand", params={}, workload=raw(p) if is_raw else attention(p), topology=REF,
                chunks=chunks, programs=programs, result_ranks=tuple(range(p)) if result is None else result,
                contributors=contributors, layout=layout)


# An all-reduce over two ranks: rank 1 sends its partial to rank 0, which sends the result back.
GOOD = [[C(0), M(1, 1), S(2, 1)], [C(0), S(1, 0), K(2, 0)]]


def first(plan: Plan):
    report = validate(plan)
    assert not report.valid, "expected a violation"
    return report.first


def test_a_correct_plan_passes() -> None:
    report = validate(hand(GOOD))
    assert report.valid and report.first is None
    assert (report.ranks, report.ops, report.steps, report.transfers) == (2, 6, 3, 2)
    check(hand(GOOD))


@pytest.mark.parametrize("programs, kwargs, kind, where", [
    ([[C(0), M(1, 5), S(2, 1)], GOOD[1]], {}, V.PEER_RANGE, (0, 1)),
    ([[C(0), M(1, 0), S(2, 1)], GOOD[1]], {}, V.SELF_SEND, (0, 1)),
    ([[C(0), M(1, 1, chunk=2), S(2, 1)], GOOD[1]], {"chunks": 2}, V.CHUNK_RANGE, (0, 1)),
    ([[C(0), M(2, 1), S(1, 1)], GOOD[1]], {}, V.STEP_ORDER, (0, 2)),
    ([[C(1), C(1, block=1), M(1, 1), S(2, 1)], GOOD[1]], {}, V.NOT_ALONE, (0, 1)),
    ([[C(0), A(1, "max", "lse"), M(1, 1), S(2, 1)], GOOD[1]], {}, V.NOT_ALONE, (0, 1)),
    ([[C(0), K(1, 1), C(1, block=1), S(2, 1)], GOOD[1]], {}, V.WRITE_CONFLICT, (0, 1)),
    ([[C(0), M(1, 1), K(1, 1), S(2, 1)], [C(0), S(1, 0), S(1, 0), K(2, 0)]], {}, V.WRITE_CONFLICT, (0, 2)),
    ([[C(0), M(1, 1), S(2, 1)], [C(0), S(1, 0)]], {}, V.UNMATCHED_SEND, (0, 2)),
    ([[C(0), M(1, 1)], GOOD[1]], {}, V.UNMATCHED_RECV, (1, 2)),
    ([[C(0), M(1, 1, 0), S(2, 1, 0)], [C(0), S(1, 0, 1), K(2, 0, 0)]], {"chunks": 2}, V.MISMATCH, (1, 1)),
    ([[C(0), S(1, 1)], [C(0), K(1, 0)]], {}, V.MISSING, (0, None)),
    ([[C(0), M(1, 1), S(2, 1)], [S(1, 0), K(2, 0)]], {}, V.EMPTY_SEND, (1, 0)),
    ([[C(0), M(1, 1), M(2, 1), S(3, 1)], [C(0), S(1, 0), S(2, 0), K(3, 0)]], {}, V.DOUBLE_COUNT, (0, 2)),
    ([[C(0), C(1), M(2, 1), S(3, 1)], [C(0), S(2, 0), K(3, 0)]], {}, V.DOUBLE_COUNT, (0, 1)),
    ([[C(0, block=5), M(1, 1), S(2, 1)], GOOD[1]], {}, V.BLOCK_RANGE, (0, 0)),
    ([[C(0), M(1, 1), S(2, 1)], [C(0), S(1, 0), K(2, 0)]], {"result": (0, 0)}, V.BAD_RESULT_RANKS, (None, None)),
])
def test_each_violation_is_located(programs, kwargs, kind, where) -> None:
    v = first(hand(programs, **kwargs))
    assert v.kind is kind, v
    assert (v.rank, v.op_index) == where, v


def test_deadlock_names_who_waits_on_whom() -> None:
    # Both ranks receive first, then send: neither receive can ever complete.
    v = first(hand([[C(0), K(1, 1), S(2, 1)], [C(0), K(1, 0), S(2, 0)]]))
    assert v.kind is V.DEADLOCK
    assert "rank 0 at step 1 (op 1) waits to recv_copy all chunks from rank 1" in v.message
    assert "rank 1 at step 1 (op 1) waits to recv_copy all chunks from rank 0" in v.message


def test_a_collective_waiting_on_a_receive_deadlocks() -> None:
    v = first(hand([[C(0), M(1, 1), A(2, "merge", "partial", "allgather")],
                    [C(0), A(1, "merge", "partial", "allgather"), S(2, 0)]]))
    assert v.kind is V.DEADLOCK and "waits in collective #0 for rank 0" in v.message


def test_raw_payloads_have_no_compute_and_broadcast_contributors() -> None:
    assert first(hand([[C(0)], [C(0)]], is_raw=True)).kind is V.BAD_OP
    # rank 1 keeps its own buffer instead of receiving rank 0's
    v = first(hand([[], []], is_raw=True, contributors=(0,)))
    assert v.kind is V.MISSING and v.rank == 1
    v = first(hand([[S(0, 1)], [M(0, 0)]], is_raw=True, contributors=(0,)))
    assert v.kind is V.EXTRA and v.rank == 1 and "ranks [1]" in v.message
    assert validate(hand([[S(0, 1)], [K(0, 0)]], is_raw=True, contributors=(0,))).valid


def test_kv_blocks_must_be_held() -> None:
    ok = [[C(0), S(1, 1, block=0), K(1, 1, block=1), C(2, block=1)],
          [C(0), S(1, 0, block=1), K(1, 0, block=0), C(2, block=0)]]
    assert validate(hand(ok)).valid
    bad = [[C(0), S(1, 1, block=1)], [C(0), K(1, 0, block=1)]]
    assert first(hand(bad)).kind is V.BLOCK_NOT_HELD
    assert first(hand([[C(0), C(1, block=1)], [C(0)]])).kind is V.BLOCK_NOT_HELD


def test_collectives() -> None:
    trio = [A(1, "max", "lse"), A(2, "sum", "num"), A(3, "sum", "den")]
    assert validate(hand([[C(0), *trio], [C(0), *trio]])).valid
    assert first(hand([[C(0), *trio[:2]], [C(0), *trio[:2]]])).kind is V.TRIO  # incomplete
    assert first(hand([[C(0), A(1, "sum", "lse")], [C(0), A(1, "sum", "lse")]])).kind is V.BAD_COLLECTIVE
    repeated = [C(0), trio[0], replace(trio[0], step=2), replace(trio[2], step=3)]
    assert first(hand([repeated, repeated])).kind is V.TRIO
    # rank 1's accumulator changes between the parts: it receives rank 0's partial in between
    v = first(hand([[C(0), trio[0], S(2, 1), replace(trio[1], step=3), replace(trio[2], step=4)],
                    [C(0), trio[0], M(2, 0), replace(trio[1], step=3), replace(trio[2], step=4)]]))
    assert v.kind is V.TRIO and v.rank == 1
    v = first(hand([[C(0), *trio], [C(0), trio[0], replace(trio[2], step=2), replace(trio[1], step=3)]]))
    assert v.kind is V.COLLECTIVE_MISMATCH and v.rank == 1
    assert first(hand([[C(0), *trio], [C(0)]])).kind is V.COLLECTIVE_MISMATCH
    gathered = [C(0), A(1, "merge", "partial", "allgather")]
    assert validate(hand([gathered, gathered])).valid
    # two ranks bring the same contribution into one collective
    v = first(hand([[C(0), S(1, 1), A(2, "merge", "partial", "allgather")],
                    [C(0), M(1, 0), A(2, "merge", "partial", "allgather")]]))
    assert v.kind is V.DOUBLE_COUNT


def test_compute_overlaps_the_transfers_of_its_step() -> None:
    # Ring attention over two ranks: each computes its own block while the blocks cross.
    ring = [[C(0), S(0, 1, block=0), K(0, 1, block=1), C(1, block=1)],
            [C(0), S(0, 0, block=1), K(0, 0, block=0), C(1, block=0)]]
    assert validate(hand(ring)).valid
    # the block received in a step is not yet held by that step's compute
    v = first(hand([[S(0, 1, block=0), K(0, 1, block=1), C(0, block=1)],
                    [C(0), S(0, 0, block=1), K(0, 0, block=0)]]))
    assert v.kind is V.BLOCK_NOT_HELD and v.rank == 0
    # a send of the compute's step carries the accumulator without it: here, nothing yet
    v = first(hand([[C(0), S(0, 1)], [C(0), M(0, 0)]]))
    assert v.kind is V.EMPTY_SEND and v.rank == 0
    # a merge and a compute into one chunk in one step: both land
    assert validate(hand([[C(1), M(1, 1), S(2, 1)], GOOD[1]])).valid


def test_heads_layout_each_rank_its_own_chunks() -> None:
    # two ranks, chunks = 2: chunk 0 is rank 0's heads, chunk 1 rank 1's; a direct reduce-scatter
    rs = [[C(0), S(1, 1, 1), M(1, 1, 0)], [C(0), S(1, 0, 0), M(1, 0, 1)]]
    assert validate(hand(rs, chunks=2, layout="heads")).valid
    # the same ops in a full layout leave each rank half the rows
    v = first(hand(rs, chunks=2))
    assert v.kind is V.MISSING and v.chunk == 1 and v.rank == 0
    # a rank that keeps the other's chunk instead of its own
    wrong = [[C(0), S(1, 1, 0), M(1, 1, 1)], [C(0), S(1, 0, 1), M(1, 0, 0)]]
    assert first(hand(wrong, chunks=2, layout="heads")).kind is V.MISSING
    with pytest.raises(Exception, match="multiple of the 2 ranks"):
        hand(rs, chunks=3, layout="heads")


def test_reduce_scatter_reduce_and_the_dcp_pair() -> None:
    rs = [C(0), A(1, "merge", "partial", "reducescatter")]
    assert validate(hand([rs, rs], chunks=2, layout="heads")).valid
    v = first(hand([rs, rs], chunks=2))
    assert v.kind is V.BAD_COLLECTIVE and "heads layout" in v.message
    root1 = Op(OpKind.COLLECTIVE, 1, peer=1, coll="reduce", reduce="merge", part="partial")
    assert validate(hand([[C(0), root1], [C(0), root1]], result=(1,))).valid
    assert first(hand([[C(0), root1], [C(0), root1]], result=(0,))).kind is V.MISSING
    no_root = replace(root1, peer=None)
    assert first(hand([[C(0), no_root], [C(0), no_root]], result=(1,))).kind is V.PEER_RANGE
    q = A(0, "copy", "q", "allgather")
    dcp = [q, C(1), A(2, "copy", "lse", "allgather"), A(3, "sum", "num", "reducescatter")]
    assert validate(hand([dcp, dcp], chunks=2, layout="heads")).valid
    assert first(hand([dcp[:3], dcp[:3]], chunks=2, layout="heads")).kind is V.TRIO  # incomplete pair
    mixed = [C(0), A(1, "copy", "lse", "allgather"), A(2, "sum", "num"), A(3, "sum", "den")]
    assert first(hand([mixed, mixed], chunks=2, layout="heads")).kind is V.TRIO
    # the query's gather changes no accumulator: alone it leaves the rows empty
    assert first(hand([[q, C(1)], [q]])).kind is V.MISSING
    assert first(hand([[C(0), A(1, "sum", "partial", "reducescatter")]] * 2, chunks=2, layout="heads")
                 ).kind is V.BAD_COLLECTIVE
    # vLLM's all-to-all: each rank ends with the merge of all in its own chunks, once
    a2a = [C(0), A(1, "merge", "partial", "alltoall")]
    assert validate(hand([a2a, a2a], chunks=2, layout="heads")).valid
    assert "heads layout" in first(hand([a2a, a2a], chunks=2)).message
    one_chunk = [C(0), Op(OpKind.COLLECTIVE, 1, chunk=0, coll="alltoall", reduce="merge", part="partial")]
    assert "chunk must be null" in first(hand([one_chunk, one_chunk], chunks=2, layout="heads")).message
    twice = a2a + [A(2, "merge", "partial", "alltoall")]
    assert first(hand([twice, twice], chunks=2, layout="heads")).kind is V.DOUBLE_COUNT


def test_check_raises_with_the_violation() -> None:
    with pytest.raises(PlanInvalidError, match="deadlock") as info:
        check(hand([[C(0), K(1, 1), S(2, 1)], [C(0), K(1, 0), S(2, 0)]]))
    assert info.value.violation.kind is V.DEADLOCK
    assert info.value.exit_code == 2


def test_structural_violations_are_all_listed() -> None:
    report = validate(hand([[C(0), M(1, 7), S(2, 9)], [C(0), S(1, 0), K(2, 0)]]))
    assert [v.kind for v in report.violations] == [V.PEER_RANGE, V.PEER_RANGE]
    assert report.to_dict()["violation"]["kind"] == "peer-out-of-range"


# -- mutations of built plans -----------------------------------------------------------------


def test_every_single_dropped_op_is_caught() -> None:
    for plan in every_plan(4, 2):
        for r, prog in enumerate(plan.programs):
            for i in range(len(prog)):
                mutated = with_program(plan, r, [op for j, op in enumerate(prog) if j != i])
                assert not validate(mutated).valid, (plan.algorithm, r, i)


def test_a_duplicated_transfer_is_a_double_count_at_the_merge() -> None:
    plan = build("binomial", attention(8), REF, chunks=2)
    (r, i) = op_indices(plan, OpKind.RECV_MERGE)[3]
    recv = plan.programs[r][i]
    sender = list(plan.programs[recv.peer])
    j = next(j for j, op in enumerate(sender) if op.kind is OpKind.SEND and op.peer == r and op.step == recv.step)
    mutated = with_program(plan, r, [*plan.programs[r][:i + 1], recv, *plan.programs[r][i + 1:]])
    mutated = with_program(mutated, recv.peer, [*sender[:j + 1], sender[j], *sender[j + 1:]])
    v = first(mutated)
    assert v.kind is V.DOUBLE_COUNT and (v.rank, v.op_index, v.chunk) == (r, i + 1, recv.chunk), v


def test_a_retargeted_peer_is_caught() -> None:
    plan = build("kary", attention(7), REF, chunks=3, fanout=3)
    for r, i in op_indices(plan, OpKind.SEND)[::5]:
        op = plan.programs[r][i]
        other = next(q for q in range(7) if q not in (r, op.peer))
        v = first(with_program(plan, r, [*plan.programs[r][:i], replace(op, peer=other), *plan.programs[r][i + 1:]]))
        # the pair's FIFO sequence shifts (a mismatch) or just gains an unmatched end
        assert v.kind in (V.UNMATCHED_SEND, V.UNMATCHED_RECV, V.MISMATCH), v


def test_exchanging_ranks_that_both_receive_first_deadlock() -> None:
    plan = build("butterfly", attention(4), REF, chunks=2)
    prog0, prog1 = list(plan.programs[0]), list(plan.programs[1])
    # round 0 of chunk 0: ranks 0 and 1 exchange in one step; make each receive, then send.
    i_recv = next(i for i, op in enumerate(prog0) if op.kind is OpKind.RECV_MERGE and op.peer == 1)
    i_send = next(i for i, op in enumerate(prog0) if op.kind is OpKind.SEND and op.peer == 1)
    j_recv = next(i for i, op in enumerate(prog1) if op.kind is OpKind.RECV_MERGE and op.peer == 0)
    j_send = next(i for i, op in enumerate(prog1) if op.kind is OpKind.SEND and op.peer == 0)
    mutated = with_program(plan, 0, split_step(prog0, i_recv, i_send))
    # One side alone cannot deadlock, but its send now carries what it just merged: rank 1's own partial.
    v = first(mutated)
    assert v.kind is V.DOUBLE_COUNT and v.rank == 1
    mutated = with_program(mutated, 1, split_step(prog1, j_recv, j_send))
    v = first(mutated)
    assert v.kind is V.DEADLOCK and {v.rank} <= {0, 1}


@st.composite
def tree_plans(draw: st.DrawFn) -> Plan:
    p = draw(st.integers(2, 16))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, p)]
    return tree_plan(parents, attention(p), REF, chunks=draw(st.integers(1, 4)))


@settings(max_examples=100, deadline=None)
@given(tree_plans(), st.data())
def test_mutations_of_tree_plans_are_caught(plan: Plan, data: st.DataObject) -> None:
    parents = plan.params["parents"]
    r = data.draw(st.integers(1, plan.ranks - 1))
    prog = list(plan.programs[r])
    # Dropping any op.
    i = data.draw(st.integers(0, len(prog) - 1))
    assert not validate(with_program(plan, r, prog[:i] + prog[i + 1:])).valid
    # Sending the last chunk up only after receiving the broadcast of that chunk: the parent
    # waits for it before it can finish the reduction that broadcast needs.
    i_send = max(i for i, op in enumerate(prog) if op.kind is OpKind.SEND and op.peer == parents[r])
    i_recv = max(i for i, op in enumerate(prog) if op.kind is OpKind.RECV_COPY)
    assert first(with_program(plan, r, split_step(prog, i_recv, i_send))).kind is V.DEADLOCK


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(ALGORITHMS)), st.integers(2, 9), st.integers(1, 3), st.data())
def test_dropping_any_op_of_any_plan_is_caught(name: str, p: int, chunks: int, data: st.DataObject) -> None:
    spec = ALGORITHMS[name]
    payload = attention(p) if "attention" in spec.payloads else raw(p)
    extra = {"parents": [-1] + list(range(p - 1))} if name == "tree" else (
        {"group_size": 2} if name == "hierarchical" else {})
    plan = build(name, payload, REF, chunks=chunks, **extra)
    r = data.draw(st.integers(0, p - 1))
    prog = list(plan.programs[r])
    i = data.draw(st.integers(0, len(prog) - 1))
    assert not validate(with_program(plan, r, prog[:i] + prog[i + 1:])).valid


@pytest.mark.parametrize("programs", [
    [[C(0), M(2, 1), S(1, 1)], GOOD[1]],
    [[C(1), C(1, block=1), M(1, 1), S(2, 1)], GOOD[1]],
    [[C(0), A(1, "max", "lse"), M(1, 1), S(2, 1)], GOOD[1]],
    [[C(0), K(1, 1), C(1, block=1), S(2, 1)], GOOD[1]],
    [[C(0), M(1, 1), K(1, 1), S(2, 1)], [C(0), S(1, 0), S(1, 0), K(2, 0)]],
])
def test_the_simulator_refuses_a_broken_step_rule_where_the_validator_reports_it(programs):
    from treeattn.cost.compute import ComputeModel
    from treeattn.cost.program import compile_plan
    from treeattn.topology.library import resolve

    plan = hand(programs)
    v = first(plan)
    cm = ComputeModel.of(plan.workload, resolve("cpu:ranks=2"))
    with pytest.raises(PlanInvalidError) as err:
        compile_plan(plan, 2, cm)
    assert str(err.value).startswith(f"rank {v.rank} op {v.op_index}: ")
    assert str(err.value).split(": ", 1)[1] in str(v)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(NEVER_BREAK, key=lambda k: k.value)), st.integers(0, 3),
                          st.one_of(st.none(), st.integers(0, 3))), min_size=2, max_size=12),
)
def test_never_break_kinds_break_no_step_rule(ops):
    # The simulator's reader skips the rules for steps of only NEVER_BREAK kinds.
    program = [S(5, peer, chunk) if kind is OpKind.SEND else M(5, peer, chunk) for kind, peer, chunk in ops]
    assert step_problem(program, 0, len(program)) is None


def test_every_other_kind_can_break_a_step_rule():
    # a second compute, a copy beside a merge of its chunk, a collective beside a send
    for other, breaker in ((OpKind.COMPUTE, [C(5), C(5)]), (OpKind.RECV_COPY, [M(5, 1, 0), K(5, 2, 0)]),
                           (OpKind.COLLECTIVE, [A(5, "max", "lse"), S(5, 1)])):
        assert other not in NEVER_BREAK and step_problem(breaker, 0, 2) is not None
    assert set(OpKind) - NEVER_BREAK == {OpKind.COMPUTE, OpKind.RECV_COPY, OpKind.COLLECTIVE}


def _with_ops(plan: Plan, order: list[int], chunks: dict[int, int | None] | None = None) -> Plan:
    """``plan`` with every rank's ops in ``order`` (indices), steps renumbered as listed, and
    ``chunks`` setting an op's chunk."""
    programs = tuple(tuple(replace(prog[i], step=s, chunk=(chunks or {}).get(i, prog[i].chunk))
                           for s, i in enumerate(order)) for prog in plan.programs)
    return replace(plan, programs=programs)


def test_a_trios_sum_before_its_lse_max_is_refused_as_the_executor_refuses_it():
    # The executor weights each row by exp(lse - max): the max of those rows must come first.
    from treeattn.topology.library import resolve
    from treeattn.workload import Workload

    topo = resolve("cpu-4")
    plan = build("allreduce3", Workload.create(ranks=4, seq_len=1024, model="llama-3.1-8b"), topo)
    assert validate(plan).valid
    for order in ([0, 2, 1, 3], [0, 3, 1, 2]):
        res = validate(_with_ops(plan, order))
        assert not res.valid and any("has no allreduce max lse of chunk 0 before it (none since the chunk's last "
                                     "trio completed): its weights exp(lse - max) need the max first" in v.message
                                     for v in res.violations)
    # The lse of chunk 0 alone, then the sums over both chunks: chunk 1 has no max yet.
    two = replace(plan, chunks=2)
    lse0 = replace(plan.programs[0][1], chunk=0)
    lse1 = replace(plan.programs[0][1], chunk=1)
    programs = tuple((prog[0], replace(lse0, step=1), replace(prog[2], step=2), replace(prog[3], step=3),
                      replace(lse1, step=4)) for prog in plan.programs)
    res = validate(replace(two, programs=programs))
    assert any("has no allreduce max lse of chunk 1 before it" in v.message for v in res.violations)
    # Each chunk's max first, then the sums over all rows: what the executor runs.
    programs = tuple((prog[0], replace(lse0, step=1), replace(lse1, step=2), replace(prog[2], step=3),
                      replace(prog[3], step=4)) for prog in plan.programs)
    assert validate(replace(two, programs=programs)).valid


def test_a_dcp_reduce_scatter_must_follow_the_lse_gather_of_its_rows():
    from treeattn.topology.library import resolve
    from treeattn.workload import Workload

    topo = resolve("cpu-4")
    plan = build("dcp-ag-rs", Workload.create(ranks=4, seq_len=1024, model="llama-3.1-8b"), topo, result="heads")
    assert validate(plan).valid
    res = validate(_with_ops(plan, [0, 2, 1]))
    assert any("reducescatter sum num over rows 0-31: no allgather copy lse is left unused before it" in v.message
               for v in res.violations)
    # Paired chunk by chunk runs; every lse first, then every sum, does not (each gather replaces the last).
    comp, lse, num = plan.programs[0]
    paired = [comp] + [replace(op, chunk=c) for c in range(plan.chunks) for op in (lse, num)]
    gathered = [comp] + [replace(lse, chunk=c) for c in range(plan.chunks)] + [
        replace(num, chunk=c) for c in range(plan.chunks)]
    for ops, ok in ((paired, True), (gathered, False)):
        programs = tuple(tuple(replace(op, step=s) for s, op in enumerate(ops)) for _ in plan.programs)
        assert validate(replace(plan, programs=programs)).valid is ok


def test_a_compact_plans_params_are_compared_with_their_types():
    # root: 0.0 or false is no root 0, though Python's == says so: a built plan's params are
    # exactly what its builder records.
    from treeattn.errors import PlanFormatError
    from treeattn.plan.compact import expand
    from treeattn.topology.library import resolve
    from treeattn.workload import Workload

    topo = resolve("cpu-4")
    plan = build("binomial", Workload.create(ranks=4, seq_len=1024, model="llama-3.1-8b"), topo)
    assert expand(plan.algorithm, dict(plan.params), plan.workload, plan.topology).programs == plan.programs
    for root in (0.0, False):
        with pytest.raises(PlanFormatError, match=r"params\.root is not what the binomial builder records"):
            expand(plan.algorithm, {**plan.params, "root": root}, plan.workload, plan.topology)
