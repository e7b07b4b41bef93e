"""The order in which the executor issues NCCL operations on its pair communicators.

On NCCL every pair of ranks has a communicator of its own (``Comm.open_pairs``), so a step
that talks to k peers issues k operations on k communicators. NCCL requires operations on
different communicators to be issued in one order on every rank, or they may deadlock (its
user guide, "Using multiple NCCL communicators concurrently"). Two ranks share exactly one
pair communicator, so comparing ranks two at a time says nothing; the condition is global:
some order of all the operations agrees with the order each rank issues its own in. Here
every rank's program runs through the real ``PlanExecutor`` and ``Comm.post`` over a process
group that only records (torch's NCCL calls replaced), and the operations issued must
contain no cycle: the k-th operation on one communicator is one node (both of its ranks
take part in it), each rank's issue order an edge from one node to the next.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.unit.test_cost_helpers import gpu_mesh
from tests.unit.test_plan_helpers import REF, every_plan
from treeattn.cost.program import _COLL, _COMPUTE
from treeattn.cost.simulate import _Engine
from treeattn.errors import PlanInvalidError
from treeattn.exec.attention import make_kv_shard, make_query, make_raw
from treeattn.exec.baselines import ring_attention
from treeattn.exec.comm import Comm
from treeattn.exec.interpreter import PlanExecutor, RankInputs
from treeattn.exec.issue_order import WORLD, issue_cycle, issue_orders, nccl_order_problem
from treeattn.plan import Op, OpKind, Plan, validate
from treeattn.plan.builders import build
from treeattn.plan.ir import message_bytes
from treeattn.workload import RawPayload, Workload


class _Work:
    def wait(self, timeout=None) -> bool:  # noqa: ANN001 - a torch Work's signature
        return True


class _P2POp:
    """What ``dist.P2POp`` keeps, without a process group to check the peer against."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None) -> None:  # noqa: ANN001
        self.op, self.tensor, self.group, self.tag, self.group_peer = op, tensor, group, tag, group_peer


class RecordingComm(Comm):
    """A rank's Comm on NCCL with a communicator for every pair; records each batch it issues
    as (communicator, ops) and delivers zeros to every receive."""

    issued: list[list[tuple[tuple[int, int], tuple[str, ...]]]]
    """Per ``post`` call (one per step with messages): the batches, in issue order."""

    def __init__(self, rank: int, world: int) -> None:
        super().__init__(rank, world, "nccl", torch.device("cpu"), op_timeout_s=1.0, setup_timeout_s=1.0)
        self.issued = []

    def _pair(self, peer: int) -> tuple[tuple[int, int], int]:
        return (min(self.rank, peer), max(self.rank, peer)), 0 if peer < self.rank else 1

    def post(self, ops):  # noqa: ANN001, ANN201
        self.issued.append([])
        return super().post(ops)

    def batch(self, p2p: list[_P2POp]) -> list[_Work]:
        for op in p2p:
            if op.op is dist.irecv:
                op.tensor.zero_()
        self.issued[-1].append((p2p[0].group, tuple("send" if op.op is dist.isend else "recv" for op in p2p)))
        return [_Work()]


@pytest.fixture
def recorded(monkeypatch):
    """Run ``body(comm)`` for each rank of ``ranks`` on a RecordingComm; return the comms."""
    current: list[RecordingComm] = []
    monkeypatch.setattr(dist, "P2POp", _P2POp)
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda p2p: current[0].batch(p2p))

    def run(ranks: int, body) -> list[RecordingComm]:  # noqa: ANN001
        comms = []
        for r in range(ranks):
            current[:] = [RecordingComm(r, ranks)]
            body(current[0])
            comms.append(current[0])
        return comms

    return run


def execute(recorded, plan: Plan) -> list[list[tuple[int, int]]]:  # noqa: ANN001
    """Each rank's communicators in the order its executor issues operations on them."""
    w = plan.workload

    def body(comm: RecordingComm) -> None:
        r = comm.rank
        inputs = RankInputs(raw=make_raw(w, r, 0)) if plan.is_raw else RankInputs(
            q=make_query(w, 0), kv=make_kv_shard(w, r, 0))
        PlanExecutor(plan, comm, inputs, timed=False).run()

    return [[pair for batches in c.issued for pair, _ in batches] for c in recorded(plan.ranks, body)]


def test_the_cycle_check_finds_a_cycle_and_only_one():
    found = issue_cycle([[(0, 1), (0, 2)], [(1, 2), (0, 1)], [(0, 2), (1, 2)]])
    assert found == [((0, 1), 0), ((0, 2), 0), ((1, 2), 0)]
    assert issue_cycle([[(0, 1), (0, 2)], [(0, 1), (1, 2)], [(0, 2), (1, 2)]]) is None
    # the second use of a communicator is a node of its own
    assert issue_cycle([[(0, 1), (0, 2), (0, 1)], [(0, 1), (0, 1)], [(0, 2)]]) is None


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("chunks", [1, 3])
def test_every_builder_issues_its_operations_in_one_order_on_every_rank(recorded, p, chunks):
    checked = 0
    for plan in every_plan(p, chunks):
        if any(op.kind is OpKind.COLLECTIVE for prog in plan.programs for op in prog):
            # library collectives on the world group: steps of their own, in one order on every
            # rank (the validator's rule); such plans send nothing point to point
            assert not any(op.is_transfer for prog in plan.programs for op in prog)
            continue
        orders = execute(recorded, plan)
        where = f"{plan.algorithm} ({plan.layout}, {plan.workload.kind}, p={p}, chunks={chunks})"
        # a function of the plan alone, the same on every rank: by step, then by pair
        assert orders == [issue_orders(plan)[r] for r in range(p)], where
        assert issue_cycle(orders) is None, where
        checked += 1
    assert checked >= 40  # every family on both payloads and each result layout it builds


def simulated_groups(plan: Plan) -> list[list[list[int]]]:
    """Per rank, per step the simulator issues groups in (on GPUs, ``issues_by_peer``): the
    peers of its groups in the order their slots come."""
    eng = _Engine(plan, gpu_mesh(plan.ranks))
    eng.run(False)
    out = []
    for r in range(plan.ranks):
        steps = []
        for lo, hi in eng.steps[r]:
            slots = {eng.peer[g]: eng.slot[g] for g in range(lo, hi)
                     if eng.kind[g] not in (_COMPUTE, _COLL) and eng.nbytes[g] and eng.peer[g] != r}
            if slots:
                steps.append(sorted(slots, key=slots.__getitem__))
        out.append(steps)
    return out


def posted_groups(recorded, plan: Plan) -> list[list[list[int]]]:  # noqa: ANN001
    """Per rank, per step with messages posted, the peers of the executor's groups in order."""
    w = plan.workload

    def body(comm: RecordingComm) -> None:
        inputs = RankInputs(raw=make_raw(w, comm.rank, 0)) if plan.is_raw else RankInputs(
            q=make_query(w, 0), kv=make_kv_shard(w, comm.rank, 0))
        PlanExecutor(plan, comm, inputs, timed=False).run()

    return [[[a if b == c.rank else b for (a, b), _ in batches] for batches in c.issued if batches]
            for c in recorded(plan.ranks, body)]


@pytest.mark.parametrize("p", [3, 5, 8])
@pytest.mark.parametrize("chunks", [1, 3])
def test_the_simulator_charges_the_groups_the_executor_posts(recorded, p, chunks):
    # One group a peer and step, in ascending peer rank (Comm._post_nccl): the simulator's
    # issue slots (treeattn.cost.simulate) must follow the same groups in the same order.
    checked = 0
    for plan in every_plan(p, chunks):
        if any(op.kind is OpKind.COLLECTIVE for prog in plan.programs for op in prog):
            continue
        where = f"{plan.algorithm} ({plan.layout}, {plan.workload.kind}, p={p}, chunks={chunks})"
        assert simulated_groups(plan) == posted_groups(recorded, plan), where
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("split", [(0, 0, 1024, 1024), (0, 2048, 0, 0), (0, 1024, 0, 1024, 0)])
def test_an_empty_message_opens_no_group_in_either(recorded, split):
    # Ring attention over shards of 0 tokens sends empty KV blocks, which Comm.post leaves out.
    w = Workload(batch=1, q_heads=8, kv_heads=2, head_dim=16, split=split)
    plan = build("ring-attention", w, REF)
    assert any(message_bytes(plan, op) == 0 for prog in plan.programs for op in prog if op.is_transfer)
    assert simulated_groups(plan) == posted_groups(recorded, plan)


def test_an_empty_message_is_done_at_its_steps_post_in_the_timeline(recorded):
    # As the simulator has it (cost.simulate): it was marked after the step's compute and the
    # waits before it in program order (a gloo run's timeline: 5813.5 us where posted at 1898.7).
    w = Workload(batch=1, q_heads=8, kv_heads=2, head_dim=16, split=(0, 0, 1024, 1024))
    plan = build("ring-attention", w, REF)
    timelines = []

    def body(comm: RecordingComm) -> None:
        ex = PlanExecutor(plan, comm, RankInputs(q=make_query(w, 0), kv=make_kv_shard(w, comm.rank, 0)))
        ex.run()
        timelines.append(ex.timeline)

    recorded(plan.ranks, body)
    empty = [m for t in timelines for m in t if m.op.is_transfer and message_bytes(plan, m.op) == 0]
    assert len(empty) == 12 and all(m.done_us == m.post_us for m in empty), empty
    sent = [m for t in timelines for m in t if m.op.is_transfer and message_bytes(plan, m.op) > 0]
    assert sent and all(m.done_us > m.post_us for m in sent)


RAW3 = RawPayload(nbytes=64, ranks=3)


def three_ranks(name: str, programs: list[tuple[Op, ...]], **kw) -> Plan:  # noqa: ANN003 - Plan's fields
    return Plan(algorithm=name, params={}, workload=RAW3, topology=REF, chunks=1, programs=programs,
                result_ranks=(0, 1, 2), **kw)


def test_a_step_posts_its_peers_in_ascending_rank_whatever_the_program_order(recorded):
    # rank 1 of a ring step sends on before it receives: (1, 2) first in its program
    raw = RAW3
    send, merge = OpKind.SEND, OpKind.RECV_MERGE
    plan = three_ranks("ring-step", [(Op(send, 0, peer=1), Op(merge, 0, peer=2)),
                                     (Op(send, 0, peer=2), Op(merge, 0, peer=0)),
                                     (Op(send, 0, peer=0), Op(merge, 0, peer=1))])
    comms = recorded(3, lambda c: PlanExecutor(plan, c, RankInputs(raw=make_raw(raw, c.rank, 0)), timed=False).run())
    assert [c.issued for c in comms] == [[[((0, 1), ("send",)), ((0, 2), ("recv",))]],
                                         [[((0, 1), ("recv",)), ((1, 2), ("send",))]],
                                         [[((0, 2), ("send",)), ((1, 2), ("recv",))]]]


@pytest.mark.parametrize(("split", "order"), [((3, 1, 2), None), ((3, 1, 2, 4), None),
                                              ((3, 1, 2, 1, 5), [3, 0, 4, 1, 2]), ((3, 0, 2, 1, 5), None)])
def test_the_ring_attention_baseline_issues_its_rotations_in_one_order(recorded, split, order):
    # each rotation sends to the next rank and receives from the previous: in that order on
    # every rank it would be a cycle around the ring (an empty KV block, not sent, breaks it)
    p = len(split)
    w = Workload(batch=1, q_heads=p, kv_heads=1, head_dim=4, split=split, kv_dtype="fp32")
    comms = recorded(p, lambda c: ring_attention(c, make_query(w, 0), make_kv_shard(w, c.rank, 0), w, "explicit",
                                                 order=order))
    orders = [[pair for batches in c.issued for pair, _ in batches] for c in comms]
    assert issue_cycle(orders) is None


def test_a_valid_plan_whose_transfers_straddle_steps_and_issue_a_cycle_is_refused_on_nccl(recorded):
    # rank 0 sends to 1 and 2 in step 0; rank 2 receives in step 0 and forwards to 1 in step
    # 1, which rank 1 receives in its step 0, before rank 0's message in its step 1. Valid
    # (every step can finish), but rank 0 issues (0, 1) before (0, 2), rank 2 (0, 2) before
    # (1, 2), rank 1 (1, 2) before (0, 1).
    raw = RAW3
    send, copy = OpKind.SEND, OpKind.RECV_COPY
    plan = three_ranks("straddle", [(Op(send, 0, peer=1), Op(send, 0, peer=2)),
                                    (Op(copy, 0, peer=2), Op(copy, 1, peer=0)),
                                    (Op(copy, 0, peer=0), Op(send, 1, peer=1))], contributors=(0,))
    assert not validate(plan).violations
    assert issue_orders(plan) == [[(0, 1), (0, 2)], [(1, 2), (0, 1)], [(0, 2), (1, 2)]]
    assert issue_cycle(issue_orders(plan)) == [((0, 1), 0), ((0, 2), 0), ((1, 2), 0)]
    assert nccl_order_problem(plan) == (
        "plan 'straddle': on NCCL its ranks would issue operations on their communicators in a cycle "
        "(ranks 0-1 -> ranks 0-2 -> ranks 1-2 -> ranks 0-1: each issued after the one before it by a rank they "
        "share), which can deadlock; put both sides of each transfer in one step")
    for r in range(3):  # every rank refuses it before posting anything
        with pytest.raises(PlanInvalidError, match="cycle"):
            PlanExecutor(plan, RecordingComm(r, 3), RankInputs(raw=make_raw(raw, r, 0)), timed=False)
    # gloo matches messages by tag, in any order: the plan runs there
    PlanExecutor(plan, Comm(0, 3, "gloo", torch.device("cpu"), op_timeout_s=1.0, setup_timeout_s=1.0),
                 RankInputs(raw=make_raw(raw, 0, 0)), timed=False)


def test_library_collectives_are_issued_on_the_communicator_of_every_rank():
    every = [plan for plan in every_plan(4, 1) if any(op.kind is OpKind.COLLECTIVE for op in plan.programs[0])]
    assert every
    for plan in every:
        orders = issue_orders(plan)
        assert all(order == orders[0] and set(order) == {WORLD} for order in orders)
        assert nccl_order_problem(plan) is None
