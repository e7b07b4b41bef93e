"""A run reports what ran, not what was asked: merges that did not compile, and methods whose
CUDA graph capture failed, run eager, and say why only on a rank's stderr, which a locally
launched run that succeeds removes with its run directory."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from treeattn.exec import kernels
from treeattn.exec import runner as runner_module
from treeattn.exec.graphs import Graphed
from treeattn.exec.runner import Job, PlanJob, _RankRun, _Timed
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef
from treeattn.workload import RawPayload

CUDA = torch.device("cuda", 0)  # only named: nothing is allocated on it


def test_the_merge_label_names_the_kernels_that_ran_eager(monkeypatch):
    monkeypatch.setenv("TREEATTN_MERGE", "auto")
    monkeypatch.setattr(kernels, "_FAILED", {})
    assert kernels.merge_label(torch.device("cpu")) == "eager"
    assert kernels.merge_label(CUDA) == "fused"
    monkeypatch.setitem(kernels._FAILED, "weighted", "no fp8 conversions")
    monkeypatch.setitem(kernels._FAILED, "merge", "no fp8 conversions")
    assert kernels.merge_label(CUDA) == "fused, but merge, weighted eager (did not compile)"
    monkeypatch.setenv("TREEATTN_MERGE", "eager")
    assert kernels.merge_label(CUDA) == "eager"


class _Comm:
    """Rank 0 of a group that meets at once (no shared clock)."""

    rank, world, cuda = 0, 1, False

    def barrier(self, stop: int = 0) -> int:
        return stop

    def now(self) -> float:
        return 0.0

    def settle(self, setup: bool = False) -> None:
        pass


@pytest.mark.parametrize("captured", [True, False])
def test_a_method_whose_capture_failed_is_not_reported_as_replayed(monkeypatch, captured):
    payload = RawPayload(nbytes=64, ranks=1)
    run = _RankRun(Job((PlanJob("p", build("allreduce", payload, TopologyRef("t", "sha256:t"))),)), _Comm(), {},
                   graphs=True)
    run._same_clock = False

    def capture(comm, fn, name, before=None):  # noqa: ANN001, ANN202 - graphs.capture's signature
        return Graphed(comm, None, None, [], before, name) if captured else fn

    monkeypatch.setattr(runner_module, "capture", capture)
    t = _Timed("p", "plan", lambda: torch.zeros(1), payload, check_ranks=(), repeats=1)
    run.warm(t)
    assert isinstance(t.fn, Graphed) is captured
    assert run.eager == ([] if captured else ["plan of p"])


def test_the_graphs_are_destroyed_before_the_group_is(monkeypatch):
    # NCCL's teardown waits for every graph that captured its operations (pytorch#115388)
    import gc
    import weakref

    payload = RawPayload(nbytes=64, ranks=1)
    run = _RankRun(Job((PlanJob("p", build("allreduce", payload, TopologyRef("t", "sha256:t"))),)), _Comm(), {},
                   graphs=True)
    run.comm.device = CUDA
    class Graph:  # stands for a torch.cuda.CUDAGraph (there is no GPU here)
        pass

    graph = Graph()
    run.known = [_Timed("p", "plan", Graphed(run.comm, graph, None, [], None, "plan"), payload, (), 1),
                 _Timed("p", "eager", lambda: torch.zeros(1), payload, (), 1)]
    held = weakref.ref(graph)
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    del graph
    run.release_graphs()
    gc.collect()
    assert held() is None and synced == [CUDA]
    with pytest.raises(RuntimeError, match="released"):
        run.known[0].fn()
    assert run.known[1].fn().shape == (1,)


def test_the_run_line_names_the_methods_whose_capture_failed():
    from treeattn.exec.runner import JobResult

    base = dict(measurements=(), backend="nccl", device="cuda:0", world=2)
    assert JobResult(**base, graphs=True).graphs_text == "on"
    assert JobResult(**base).graphs_text == "off"
    failed = JobResult(**base, uncaptured=("plan of p", "allreduce2 of p"))
    assert failed.graphs_text == "on, but not for plan of p, allreduce2 of p (capture failed: see the rank's log)"


class _Device(_Comm):
    """A device whose marks can be read only once ``settle`` has seen them passed (CUDA's events:
    the time of one the device has not passed yet is not ready)."""

    def __init__(self) -> None:
        self.tracked: list[object] = []
        self.passed: set[int] = set()

    def origin(self) -> tuple[float, object]:
        return 0.0, self.mark()

    def mark(self) -> object:
        return object()

    def track(self, what: str, mark: object = None) -> None:
        self.tracked.append(mark)

    def settle(self, setup: bool = False) -> None:
        self.passed.update(id(m) for m in self.tracked)
        self.tracked = []

    def seconds(self, mark: object, origin: tuple[float, object]) -> float:
        return 1.0 if id(mark) in self.passed else float("nan")


def test_a_timed_run_reads_its_end_only_once_the_device_has_passed_it():
    # The last op's marker passes while kernels queued behind it still run: settling on the
    # markers alone left the end unread (NaN), on a GPU, for every eager method.
    payload = RawPayload(nbytes=64, ranks=1)
    run = _RankRun(Job((PlanJob("p", build("allreduce", payload, TopologyRef("t", "sha256:t"))),)), _Device(), {})
    run._same_clock = False
    t = _Timed("p", "plan", lambda: torch.zeros(1), payload, check_ranks=(), repeats=2)
    for _ in range(2):
        run.time_once(t)
    assert t.ends == [1.0, 1.0]


def test_a_timed_plan_run_is_handed_the_origin_its_time_counts_from():
    # One Comm.origin a timed run (on CUDA a wait for the device), the plan's as a baseline's.
    comm = _Device()
    taken = []
    origin = comm.origin
    comm.origin = lambda: taken.append(origin()) or taken[-1]
    payload = RawPayload(nbytes=64, ranks=1)
    run = _RankRun(Job((PlanJob("p", build("allreduce", payload, TopologyRef("t", "sha256:t"))),)), comm, {})
    run._same_clock = False
    executor = SimpleNamespace(origin=None, clock=None)
    seen = []
    t = _Timed("p", "plan", lambda: seen.append(executor.clock) or torch.zeros(1), payload, check_ranks=(),
               repeats=1, executor=executor)
    run.time_once(t)
    assert len(taken) == 1 and seen == taken
