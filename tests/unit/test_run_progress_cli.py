"""``treeattn run`` passes the launcher's progress to the CLI's reporter (lines off a terminal,
none with --no-progress); what the ranks report is tests/distributed/test_exec_progress.py's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.cli import progress as progress_cli
from treeattn.exec import launch as launch_mod
from treeattn.exec.runner import JobResult, Measurement
from treeattn.plan.builders import build
from treeattn.plan.io import save_plan
from treeattn.topology.library import resolve
from treeattn.workload import Workload


@pytest.fixture()
def plan(tmp_path: Path) -> Path:
    w = Workload(batch=2, q_heads=4, kv_heads=2, head_dim=8, split=(9, 0), kv_dtype="fp32")
    return save_plan(build("star", w, resolve("cpu:ranks=2")), tmp_path / "plan.yaml")


def _ranks_that_report(given: list) -> object:
    def launch(job, progress=None, setup_watchdog=False):  # noqa: ANN001, ANN202, ARG001 - launch's signature
        given.append(progress)
        if progress is not None:
            for done in range(1, 4):
                progress(done, 3, "timed runs: plan of plan.yaml")
                time.sleep(0.05)
        m = Measurement("plan.yaml", "plan", "explicit", (10.0, 12.0), max_rel_err=0.0, tolerance=1e-5,
                        checked_ranks=(0,))
        return JobResult((m,), "gloo", "cpu", 2)

    return launch


def test_run_prints_the_ranks_progress_off_a_terminal(plan, tmp_path, monkeypatch):
    monkeypatch.setattr(progress_cli, "PROGRESS_EVERY_S", 0.02)
    given: list = []
    monkeypatch.setattr(launch_mod, "launch", _ranks_that_report(given))
    res = run_cli("run", str(plan), "--out", str(tmp_path / "r.csv"))
    assert res.exit_code == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("measuring: ")]
    assert any(ln.startswith("measuring: timed runs: plan of plan.yaml: ") and "/3 steps, " in ln for ln in lines)
    res = run_cli("run", str(plan), "--out", str(tmp_path / "q.csv"), "--no-progress")
    assert res.exit_code == 0 and "measuring: " not in res.stderr, res.stderr
    assert callable(given[0]) and given[1] is None
