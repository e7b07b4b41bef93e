"""The host's deadline bookkeeping of device work (``treeattn.exec.deadline``), driven by markers
that say whether they passed (as a CUDA event's ``query`` does) and a clock the test moves; and
the interpreter waiting (so marking) once per work handle, over a Comm that posts like NCCL."""

from __future__ import annotations

import pytest
import torch

from treeattn.exec.comm import Comm, distinct, first_uses
from treeattn.exec.deadline import Outstanding, first_pending, wait_marks
from treeattn.exec.interpreter import PlanExecutor, RankInputs
from treeattn.exec.merge import clear_partial
from treeattn.plan.builders import build
from treeattn.plan.ir import OpKind, TopologyRef
from treeattn.workload import Workload


class Marker:
    def __init__(self, done: bool = False) -> None:
        self.done = done
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.t

    def sleep(self, _s: float) -> None:  # each wait step moves the clock a tenth of a second
        self.sleeps += 1
        self.t += 0.1


def marks(*names: str, done: bool = False) -> list[tuple[Marker, str]]:
    return [(Marker(done), name) for name in names]


def ledger(clock: Clock, bound: int = 2, limit: float = 1.0) -> Outstanding:
    return Outstanding(limit, bound, lambda what: TimeoutError(what), clock, clock.sleep)


def test_a_finished_call_costs_one_query_of_its_newest_marker():
    clock = Clock()
    out = ledger(clock)
    call = marks("a", "b", "c", done=True)
    out.add(call)
    out.check()
    assert len(out) == 0 and [m.queries for m, _ in call] == [0, 0, 1] and clock.sleeps == 0


def test_unfinished_calls_within_the_bound_never_wait():
    clock = Clock()
    out = ledger(clock, bound=2)
    first, second = marks("a1", "a2"), marks("b1")
    out.add(first)
    out.add(second)
    out.check()
    # only the oldest is looked at until it finishes; nothing slept
    assert len(out) == 2 and clock.sleeps == 0 and first[1][0].queries == 1 and second[0][0].queries == 0
    out.add([])  # a call without markers (nothing to wait for) is not held
    assert len(out) == 2


def test_the_oldest_unfinished_call_raises_after_the_deadline_naming_its_first_pending_op():
    clock = Clock()
    out = ledger(clock, limit=1.0)
    call = marks("recv chunk 0 with rank 1", "recv chunk 1 with rank 2")
    call[0][0].done = True
    out.add(call)
    out.check()  # first seen unfinished at 0
    clock.t = 0.9
    out.check()
    clock.t = 1.2
    with pytest.raises(TimeoutError, match="^recv chunk 1 with rank 2$"):
        out.check()
    assert clock.sleeps == 0  # found by queries alone


def test_a_call_ages_only_once_the_calls_before_it_have_finished():
    clock = Clock()
    out = ledger(clock, limit=1.0)
    a, b = marks("a"), marks("b")
    out.add(a)
    out.add(b)
    out.check()  # a seen unfinished at 0; b, queued behind it, not yet
    clock.t = 0.9
    a[0][0].done = True
    out.check()  # a finished; b's clock starts now
    clock.t = 1.5
    out.check()
    clock.t = 2.0
    with pytest.raises(TimeoutError, match="^b$"):
        out.check()


def test_more_calls_than_the_bound_wait_for_the_oldest():
    clock = Clock()
    out = ledger(clock, bound=2, limit=5.0)
    calls = [marks(f"call {i}") for i in range(3)]
    for c in calls:
        out.add(c)
    oldest = calls[0][0][0]
    real_sleep = clock.sleep

    def sleep(s: float) -> None:
        real_sleep(s)
        oldest.done = clock.sleeps >= 3  # the device finishes the oldest after a while

    out._sleep = sleep
    out.check()
    assert len(out) == 2 and clock.sleeps == 3


def test_a_host_ahead_of_a_hung_device_raises_within_the_deadline():
    clock = Clock()
    out = ledger(clock, bound=2, limit=1.0)
    raised = None
    for i in range(10):
        try:
            out.check()
        except TimeoutError as exc:
            raised = (i, str(exc), clock.t)
            break
        out.add(marks(f"call {i}"))
        clock.t += 0.01  # the host issues a call every 10 ms; the device never finishes one
    assert raised is not None
    i, what, t = raised
    assert i == 3 and what == "call 0" and 1.0 < t < 1.2  # stopped at the bound, raised by the deadline
    assert len(out) == 3


def test_a_replayed_graph_names_its_op_only_when_no_later_replay_recorded_the_markers_again():
    clock = Clock()
    shared = marks("send chunk 0 with rank 1", "recv chunk 0 with rank 1")
    out = ledger(clock, bound=3, limit=1.0)
    out.add([*shared, (Marker(), "the end of p")], replay="the Merger's program of plan 'p'")
    out.check()
    clock.t = 1.5
    with pytest.raises(TimeoutError, match="^send chunk 0 with rank 1$"):
        out.check()
    out.add([*shared, (Marker(), "the end of p")], replay="the Merger's program of plan 'p'")
    with pytest.raises(TimeoutError, match=r"^the Merger's program of plan 'p' \(a CUDA graph replay; which of its "
                                           r"ops is not known: 1 later call\(s\) replayed it again\)$"):
        out.check()


def test_drain_waits_for_every_call():
    clock = Clock()
    out = ledger(clock, bound=5, limit=10.0)
    a, b = marks("a"), marks("b")
    out.add(a)
    out.add(b)
    real_sleep = clock.sleep

    def sleep(s: float) -> None:
        real_sleep(s)
        a[0][0].done = True
        b[0][0].done = clock.sleeps >= 2

    out._sleep = sleep
    out.drain()
    assert len(out) == 0


def test_wait_marks_checks_the_newest_first_and_walks_only_when_it_has_not_passed():
    clock = Clock()
    done = marks("a", "b", "c", done=True)
    wait_marks(done, 1.0, TimeoutError, clock, clock.sleep)
    assert [m.queries for m, _ in done] == [0, 0, 1]
    stuck = marks("a", "b", "c")
    stuck[0][0].done = True
    with pytest.raises(TimeoutError, match="^b$"):
        wait_marks(stuck, 1.0, TimeoutError, clock, clock.sleep)
    assert first_pending(stuck) == "b"
    wait_marks([], 1.0, TimeoutError, clock, clock.sleep)


class NcclLikeComm(Comm):
    """Posts as NCCL does with pair communicators (one handle per peer per batch) and delivers
    the merge's identity to every receive; records what each wait names."""

    def __init__(self) -> None:
        super().__init__(0, 3, "gloo", torch.device("cpu"), op_timeout_s=1.0, setup_timeout_s=1.0)
        self.waits: list[str] = []

    def post(self, ops):  # noqa: ANN001, ANN201
        handles: dict[int, object] = {}
        for op in ops:
            if not op.send:
                clear_partial(op.tensor.view(-1, op.tensor.shape[-1]))
        return [handles.setdefault(op.peer, object()) for op in ops]

    def wait(self, work, what, setup=False):  # noqa: ANN001, ANN201, ARG002
        self.waits.append(what)


def test_ops_sharing_a_work_handle_are_waited_for_and_marked_once():
    w = Workload(batch=1, q_heads=4, kv_heads=2, head_dim=8, split=(5, 6, 7), kv_dtype="fp32")
    plan = build("star", w, TopologyRef("cpu:test", "sha256:test"), chunks=2)
    comm = NcclLikeComm()
    partial = torch.randn(w.rows, w.head_dim + 1)
    ex = PlanExecutor(plan, comm, RankInputs(partial=partial.clone()), timed=False)
    acc = ex.run()
    # rank 0's 8 transfers: step 1 one op per peer, steps 2 and 3 two ops per peer
    assert comm.waits == ["recv_merge chunk 0 with rank 1 (step 1)", "recv_merge chunk 0 with rank 2 (step 1)",
                          "recv_merge chunk 1 with rank 1 (step 2)", "recv_merge chunk 1 with rank 2 (step 2)",
                          "send chunk 1 with rank 1 (step 3)", "send chunk 1 with rank 2 (step 3)"]
    assert torch.allclose(acc, partial)  # merged with the identity: its own partial


def test_distinct_keeps_each_handle_once_in_order():
    a, b = object(), object()
    assert first_uses([a, None, a, b, None, b, a]) == [True, False, False, True, False, False, False]
    assert distinct([a, None, a, b, None, b, a]) == [a, b]
    assert first_uses([None, None]) == [False, False] and distinct([None, None]) == []


class TimedNcclLikeComm(NcclLikeComm):
    """As on CUDA with timing: each distinct work of a step gets a completion marker on a side
    stream of its own (``done_mark``), here recorded instead of recorded on a device."""

    def __init__(self) -> None:
        super().__init__()
        self.cuda = True
        self.posted: list[list[object]] = []
        self.marked: list[tuple[int, object]] = []
        self.joined: list[int] = []
        self.clock = 0.0

    def post(self, ops):  # noqa: ANN001, ANN201
        works = super().post(ops)
        self.posted.append(works)
        return works

    def mark(self, stream=None) -> float:  # noqa: ANN001, ARG002
        self.clock += 1.0
        return self.clock

    def origin(self) -> tuple[float, float]:  # no device to wait for: its marks are the clock
        return self.clock, self.mark()

    def done_mark(self, work, slot: int) -> float:  # noqa: ANN001
        self.marked.append((slot, work))
        return 100.0 + len(self.marked)

    def join_sides(self, used: int) -> None:
        self.joined.append(used)


def test_ops_sharing_a_work_handle_share_one_completion_marker():
    w = Workload(batch=1, q_heads=4, kv_heads=2, head_dim=8, split=(5, 6, 7), kv_dtype="fp32")
    plan = build("star", w, TopologyRef("cpu:test", "sha256:test"), chunks=2)
    comm = TimedNcclLikeComm()
    ex = PlanExecutor(plan, comm, RankInputs(partial=torch.randn(w.rows, w.head_dim + 1)), timed=True)
    ex.run()
    # per step, one marker per distinct work in first-seen order, on side streams 0, 1, ...
    want = [(slot, work) for works in comm.posted for slot, work in enumerate(distinct(works))]
    assert comm.marked == want and len(want) == 6
    assert comm.joined == [len(distinct(works)) for works in comm.posted] == [2, 2, 2]
    # each transfer completes at its work's marker: the two ops with one peer in one step alike
    done = {(m.op.step, m.op.peer): set() for m in ex.timeline if m.op.kind is not OpKind.COMPUTE}
    for m in ex.timeline:
        if m.op.kind is not OpKind.COMPUTE:
            done[m.op.step, m.op.peer].add(m.done_us)
    assert all(len(times) == 1 for times in done.values()) and len(done) == 6
