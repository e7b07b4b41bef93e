"""``treeattn run`` says how far it has got: rank 0's runs, passed on by the launcher (the CLI's
lines: tests/unit/test_run_progress_cli.py)."""

from __future__ import annotations

import pytest

from treeattn.exec.launch import launch
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import build
from treeattn.topology.library import resolve
from treeattn.workload import Workload

pytestmark = pytest.mark.untimed  # checks what is said, not how long anything takes

W2 = Workload(batch=2, q_heads=4, kv_heads=2, head_dim=8, split=(9, 0), kv_dtype="fp32")


@pytest.mark.parametrize("order", ["interleaved", "blocked"])
def test_local_ranks_report_every_run_of_every_method(order):
    plan = build("binomial", W2, resolve("cpu:ranks=2"))
    seen: list[tuple[int, int, str]] = []
    opts = RunOptions(repeats=5, warmup=1, baselines=True, order=order)
    result = launch(Job((PlanJob("p.yaml", plan),), opts), progress=lambda *got: seen.append(got))
    methods = len(result.measurements)
    assert methods == 5  # the plan and four baselines
    total = methods * (1 + 1 + 5)  # each: the checked run, one warm-up, five timed
    assert seen and seen[-1] == (total, total, seen[-1][2]) and seen[-1][2].startswith("timed runs: ")
    done = [d for d, _, _ in seen]
    assert done == sorted(done) and all(d <= t for d, t, _ in seen)
    assert all(what == "starting" or what.endswith(" of p.yaml") for _, _, what in seen)
