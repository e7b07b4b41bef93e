"""How a local gloo run starts its ranks: forked from one interpreter that imported torch once
(``worker.fork_ranks``), adopted by the launcher; where that cannot be (no child subreaper, or
NCCL), one interpreter each. Both give the same exact results, and a forking process that fails
is one line."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.distributed.test_exec_faults import W3, children
from treeattn.errors import ExecutionError
from treeattn.exec import launch as launching
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.exec.worker import PIDS_FILE
from treeattn.plan.builders import build
from treeattn.plan.ir import TopologyRef

pytestmark = pytest.mark.untimed  # checks results only: scripts/test.sh runs it beside timed tests

REF = TopologyRef("cpu:test", "sha256:test")
JOB = Job((PlanJob("p", build("binomial", W3, REF, chunks=2)),), RunOptions(repeats=2, warmup=1, timeout_s=30))


def started(monkeypatch) -> list[list]:
    """The rank processes each ``forked_ranks`` call of the launcher started (the real function)."""
    calls: list[list] = []
    real = launching.forked_ranks

    def record(tmp, n, env, procs):  # noqa: ANN001, ANN202 - forked_ranks' signature
        forked = real(tmp, n, env, procs)
        calls.append(list(procs) if forked else [])
        return forked

    monkeypatch.setattr(launching, "forked_ranks", record)
    return calls


def test_gloo_ranks_are_forked_adopted_and_exact(monkeypatch):
    calls = started(monkeypatch)
    before = set(children())
    result = launching.launch(JOB)
    assert [m.correct for m in result.measurements] == [True]
    (procs,) = calls
    # Reaped by this process with their own exit status: its children, not the forking process's.
    assert len(procs) == 3 and [p.returncode for p in procs] == [0, 0, 0]
    assert set(children()) <= before


def test_without_a_subreaper_each_rank_is_its_own_interpreter(monkeypatch):
    calls = started(monkeypatch)
    monkeypatch.setattr(launching, "_subreaper", lambda on: None)  # as where prctl has no such option
    result = launching.launch(JOB)
    assert [m.correct for m in result.measurements] == [True]
    assert calls == [[]]


def test_a_forking_process_that_fails_is_one_line(monkeypatch, tmp_path: Path):
    broken = tmp_path / "site"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text("raise ImportError('this torch is broken')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken))  # this process has its torch; the forking one gets this
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = set(children())
    with pytest.raises(ExecutionError) as info:
        launching.launch(JOB)
    assert str(info.value) == ("the ranks could not be started: the process that forks them exited with code 1; "
                               "last output: ImportError: this torch is broken")
    assert set(children()) <= before
    assert not list(tmp_path.glob("treeattn-run-*"))


@pytest.mark.parametrize("handler", [signal.SIG_IGN, lambda sig, frame: None], ids=["ignored", "handled"])
def test_a_caller_that_ignores_or_handles_sigchld_gets_one_interpreter_a_rank(monkeypatch, handler):
    # With SIGCHLD ignored the kernel reaps children itself, and a handler may reap any child
    # (asyncio's watchers that wait for any): adopted ranks' exit status could be lost.
    calls = started(monkeypatch)
    previous = signal.signal(signal.SIGCHLD, handler)
    try:
        result = launching.launch(JOB)
    finally:
        signal.signal(signal.SIGCHLD, previous)
    assert [m.correct for m in result.measurements] == [True]
    assert calls == [[]]


def test_launches_from_two_threads_at_once_each_adopt_their_ranks(monkeypatch):
    # Whether orphans are adopted is the process's setting: one thread's start must not unset it
    # while the other's forking process runs.
    calls = started(monkeypatch)
    got: dict[int, object] = {}

    def one(i: int) -> None:
        try:
            got[i] = [m.correct for m in launching.launch(JOB).measurements]
        except Exception as exc:  # noqa: BLE001 - said by the assert below
            got[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:  # the second a second later: its forking process ends after the first's
        t.start()
        time.sleep(1.0)
    for t in threads:
        t.join(timeout=120)
    assert got == {0: [True], 1: [True]}
    assert [len(procs) for procs in calls] == [3, 3]


def test_a_forking_process_that_fails_after_forking_leaves_no_process(tmp_path: Path):
    tmp = launching.run_directory("treeattn-run-", JOB)
    try:
        (tmp / f"{PIDS_FILE}.tmp").mkdir()  # the pid file cannot be written: the ranks are forked by then
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(launching.free_port()),
                   TREEATTN_PARENT_PID=str(os.getpid()))
        before = set(every_child())
        with pytest.raises(ExecutionError, match=r"^the ranks could not be started: the process that forks them "
                                                 r"exited with code 1; last output: IsADirectoryError"):
            launching.forked_ranks(tmp, 3, env, [])
        assert set(every_child()) <= before  # zombies included: what was adopted was reaped
    finally:
        shutil.rmtree(tmp)


def every_child() -> list[int]:
    """Pids of this process's children, zombies included."""
    me = os.getpid()
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == me]


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
