"""Result rows, CSV/JSON output and prediction set-up of ``treeattn run`` (no processes started)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from treeattn.errors import InputError, TopologyError
from treeattn.exec import results
from treeattn.exec.interpreter import MeasuredOp
from treeattn.exec.predict import predict, resolve_topology
from treeattn.exec.results import (
    COLUMNS,
    new_run_file,
    new_run_id,
    result_rows,
    rows_records,
    timeline_rows,
    workload_label,
    write_csv,
)
from treeattn.exec.runner import JobResult, Measurement, RunOptions, interleaved_order
from treeattn.plan.baselines import Baseline
from treeattn.plan.builders import build
from treeattn.plan.ir import Op, OpKind, TopologyRef
from treeattn.topology.library import resolve
from treeattn.workload import RawPayload, Workload

W = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=16, split=(10, 0, 5, 7), kv_dtype="bf16", model=None)


def test_workload_label():
    assert workload_label(W) == "B2 Hq8/2 D16 N22 bf16/fp32 split=10,0,5,7"
    even = Workload.create(ranks=4, seq_len=4096, model="llama-3.1-8b")
    assert workload_label(even) == "llama-3.1-8b B1 Hq32/8 D128 N4096 bf16/fp32"
    assert workload_label(RawPayload(nbytes=1024, ranks=2)) == "raw 1024B fp32 sum"


def test_measurement_statistics():
    m = Measurement("p", "plan", "explicit", (5.0, 1.0, 3.0, 2.0, 4.0), max_rel_err=1e-6, tolerance=1e-5,
                    checked_ranks=(0,))
    assert m.median_us == 3.0 and m.correct
    assert m.spread_us == pytest.approx(4.6 - 1.4)
    assert not Measurement("p", "plan", "explicit", (1.0,), 2e-5, 1e-5, (0,)).correct


def test_rows_csv_json_and_timeline(tmp_path):
    topo = resolve("cpu:ranks=4,cores=2")
    plan = build("star", W, topo)
    timing = MeasuredOp(0, 0, Op(OpKind.COMPUTE, 0), 1.0, 9.5)
    ms = (Measurement("a.yaml", "plan", "explicit", (10.0, 20.0, 30.0), 1e-7, 2e-2, (0,), (timing,)),
          Measurement("a.yaml", "allreduce3", "explicit", (40.0,), float("inf"), 2e-2, (0, 1, 2, 3)))
    preds = predict(plan, topo, (Baseline("allreduce3"),))
    frame = result_rows(JobResult(ms, "gloo", "cpu", 4), {"a.yaml": plan}, {"a.yaml": preds}, "rid")
    assert list(frame.columns) == list(COLUMNS)
    plan_row, base_row = frame.to_dict(orient="records")
    assert plan_row["measured_median_us"] == 20.0 and plan_row["correct"] and plan_row["topology"] == topo.name
    assert plan_row["predicted_us"] > 0
    assert plan_row["rel_error"] == pytest.approx(20.0 / plan_row["predicted_us"] - 1, abs=1e-4)
    assert not base_row["correct"] and pd.isna(base_row["max_rel_err"])
    rows = json.loads(json.dumps(rows_records(frame)))
    assert rows[1]["max_rel_err"] is None and rows[0]["method"] == "plan"
    path = tmp_path / "out" / "r.csv"
    write_csv(frame, path)
    write_csv(frame, path)  # appends without a second header
    again = pd.read_csv(path)
    assert len(again) == 4 and list(again.columns) == list(COLUMNS)
    tl = timeline_rows(JobResult(ms, "gloo", "cpu", 4), "rid")
    assert tl.to_dict(orient="records")[0]["kind"] == "compute" and len(tl) == 1


def test_topology_resolution_and_warnings(tmp_path):
    topo = resolve("cpu:ranks=4,cores=2")
    mine = build("star", W, topo)
    assert resolve_topology(mine, None) == (topo, [])
    # Never another topology without saying so: a fingerprint that differs, or a name not
    # found here, gives no prediction and says what to pass.
    other = build("star", W, TopologyRef("dgx-h100", "sha256:0123456789abcdef"))
    found, warnings = resolve_topology(other, None)
    assert found is None and "pass --topology" in warnings[0] and "no predictions" in warnings[0]
    unknown = build("star", W, TopologyRef("no-such-machine", "sha256:0"))
    found, warnings = resolve_topology(unknown, None, tmp_path / "p.yaml")
    assert found is None and "'no-such-machine'" in warnings[0] and "pass --topology" in warnings[0]
    found, warnings = resolve_topology(unknown, "cpu:ranks=4,cores=2")
    assert found == topo and "predictions may not match" in warnings[0]
    with pytest.raises(TopologyError):
        resolve_topology(mine, "no-such-topology")
    # a --topology of another rank count is the user's mistake: said before anything runs
    with pytest.raises(InputError, match="'cpu:ranks=2' has 2 ranks but the plan runs on 4"):
        resolve_topology(mine, "cpu:ranks=2")
    assert predict(mine, None, (Baseline("allreduce3"),)).us == {"plan": None, "allreduce3": None}


def test_a_recorded_topology_file_is_read_from_the_plans_folder(tmp_path):
    from treeattn.topology.io import dump_topology

    topo = resolve("cpu:ranks=4,cores=2")
    (tmp_path / "topos").mkdir()
    (tmp_path / "topos" / "mine.yaml").write_text(dump_topology(topo))
    plan = build("star", W, TopologyRef(topo.name, topo.fingerprint, "../topos/mine.yaml"))
    found, warnings = resolve_topology(plan, None, tmp_path / "plans" / "p.yaml")
    assert found.fingerprint == topo.fingerprint and warnings == []


def test_interleaved_order_deals_every_method_once_per_round():
    order = interleaved_order([3] * 5, seed=0)
    rounds = [order[i:i + 5] for i in range(0, 15, 5)]
    assert all(sorted(r) == list(range(5)) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # shuffled per round, not one fixed order
    assert interleaved_order([3] * 5, seed=0) == order  # every rank computes the same order
    assert interleaved_order([3] * 5, seed=1) != order


@given(st.lists(st.integers(0, 6), max_size=6), st.integers(0, 3))
def test_interleaved_order_times_each_method_its_own_count_in_rounds(repeats, seed):
    order = interleaved_order(repeats, seed)
    assert [order.count(i) for i in range(len(repeats))] == repeats
    # Round r holds the methods with more than r runs, each once; rounds come in order.
    pos = 0
    for r in range(max(repeats, default=0)):
        live = sorted(i for i, n in enumerate(repeats) if n > r)
        assert sorted(order[pos:pos + len(live)]) == live
        pos += len(live)


def test_unknown_order_is_an_input_error():
    with pytest.raises(InputError, match="unknown order 'random'"):
        RunOptions(order="random")


def test_the_timeline_csv_writes_ranks_and_chunks_as_integers(tmp_path):
    # A compute op has no peer nor chunk: the column beside it must still read peer 1, not "1.0".
    ops = (MeasuredOp(0, 0, Op(OpKind.COMPUTE, 0), 1.0, 9.5), MeasuredOp(0, 1, Op(OpKind.SEND, 1, peer=1, chunk=0),
                                                                          9.5, 12.0))
    ms = (Measurement("a.yaml", "plan", "explicit", (10.0,), 1e-7, 2e-2, (0,), ops),)
    path = tmp_path / "r.timeline.csv"
    write_csv(timeline_rows(JobResult(ms, "gloo", "cpu", 2), "rid"), path)
    compute, send = path.read_text().splitlines()[1:]
    assert compute.split(",")[6:9] == ["", "", ""] and send.split(",")[6:9] == ["1", "0", ""]


SECOND = "20261204-061500"  # one second, for runs that start within it


def test_run_ids_start_with_the_time_and_name_the_plan(tmp_path, monkeypatch):
    assert re.fullmatch(r"\d{8}-\d{6}-my_plan\.v2", new_run_id("my plan.v2"))
    monkeypatch.setattr(results.time, "strftime", lambda fmt, *a: SECOND)
    first, path = new_run_file(tmp_path / "runs", "p")
    assert first == f"{SECOND}-p" and path == tmp_path / "runs" / f"{first}.csv" and path.read_bytes() == b""
    (tmp_path / "runs" / f"{SECOND}.2-p.timeline.csv").touch()  # a timeline left by another run takes its id
    second, _ = new_run_file(tmp_path / "runs", "p")
    assert second == f"{SECOND}.3-p" and sorted([second, first]) == [first, second]  # sorted: as started


def test_runs_started_in_one_second_never_share_a_file(tmp_path, monkeypatch):
    monkeypatch.setattr(results.time, "strftime", lambda fmt, *a: SECOND)
    start = threading.Barrier(8)
    got = []

    def pick():
        start.wait()
        got.append(new_run_file(tmp_path, "p"))

    threads = [threading.Thread(target=pick) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({run_id for run_id, _ in got}) == 8 and len({path for _, path in got}) == 8
    assert all(run_id.startswith(SECOND) for run_id, _ in got)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(path.name for _, path in got)


def test_run_processes_started_in_one_second_never_share_a_file(tmp_path):
    code = ("import sys, time; from pathlib import Path; from treeattn.exec import results; "
            f"time.strftime = lambda *a: {SECOND!r}; print(results.new_run_file(Path(sys.argv[1]), 'p')[0])")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    ids = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(ids)) == 4 and {f"{i}.csv" for i in ids} == {p.name for p in tmp_path.iterdir()}


def test_a_run_without_out_takes_a_new_file_and_gives_it_back_unused(tmp_path, monkeypatch):
    from treeattn.cli.run import run_rows

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(results.time, "strftime", lambda fmt, *a: SECOND)
    with run_rows(None, "p") as (one, rows_one), run_rows(None, "p") as (two, rows_two):
        assert one != two and rows_one != rows_two and rows_one.exists() and rows_two.exists()
        write_csv(pd.DataFrame({"run_id": [one]}), rows_one)
    assert rows_one.read_text() == f"run_id\n{one}\n" and not rows_two.exists()  # no rows: no file
    with pytest.raises(RuntimeError), run_rows(None, "p") as (_, failed):
        raise RuntimeError("the run failed")
    assert not failed.exists()
    files = sorted(p.name for p in rows_one.parent.iterdir())
    with run_rows(None, "p", reserve=False):  # a rank that writes no rows takes no file
        assert sorted(p.name for p in rows_one.parent.iterdir()) == files


def test_a_rows_file_that_vanishes_while_checked_is_appendable(tmp_path, monkeypatch):
    # another rank's writability check made the empty file and removes it meanwhile
    path = tmp_path / "rows.csv"
    path.touch()
    real_stat, seen = type(path).stat, []

    def vanish(self, *a, **k):
        if self == path:
            seen.append(1)
            if len(seen) == 2:  # after is_file() found it
                self.unlink()
        return real_stat(self, *a, **k)

    monkeypatch.setattr(type(path), "stat", vanish)
    assert results.appendable_problem(path, results.COLUMNS) is None
    assert len(seen) == 2
