"""``treeattn run``: end to end on local gloo ranks, and its refusals and exit statuses."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from tests.cli_helpers import run_cli
from treeattn.exec import launch as launch_mod
from treeattn.exec.interpreter import FAULT_ENV
from treeattn.exec.results import COLUMNS
from treeattn.exec.runner import JobResult, Measurement
from treeattn.plan.builders import build
from treeattn.plan.io import save_plan
from treeattn.plan.ir import Op, OpKind, Plan, TopologyRef
from treeattn.topology.library import resolve
from treeattn.workload import Workload

TREEATTN = str(Path(sys.executable).with_name("treeattn"))
W2 = Workload(batch=2, q_heads=4, kv_heads=2, head_dim=8, split=(9, 0), kv_dtype="fp32")


def plan_file(tmp_path: Path, plan: Plan, name: str = "plan.yaml") -> Path:
    return save_plan(plan, tmp_path / name)


def test_run_end_to_end_json(tmp_path):
    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2"), chunks=2))
    out = tmp_path / "res" / "rows.csv"
    args = [TREEATTN, "run", str(path), "--baselines", "--repeats", "2", "--warmup", "0", "--check", "all",
            "--json", "--out", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    data = json.loads(proc.stdout)
    assert data["rows_csv"] == str(out) and data["timeline_csv"] == str(out.with_name("rows.timeline.csv"))
    assert data["calibrated"] is False  # cpu:ranks=2 as shipped
    rows = data["rows"]
    assert [r["method"] for r in rows] == ["plan", "allreduce3", "allreduce2", "allgather-merge", "ring-attention"]
    for r in rows:
        assert set(r) == set(COLUMNS)
        assert r["correct"] is True and r["max_rel_err"] < 1e-5
        assert r["ranks"] == 2 and r["algorithm"] == "binomial" and r["plan"] == "plan.yaml"
        assert r["predicted_us"] > 0 and r["measured_median_us"] > 0
        assert r["rel_error"] == pytest.approx(r["measured_median_us"] / r["predicted_us"] - 1, abs=1e-3)
        assert r["same_bits"] is True  # every rank holds the result; two ranks merge their two partials alike
    frame = pd.read_csv(out)
    assert list(frame.columns) == list(COLUMNS) and len(frame) == 5
    timeline = pd.read_csv(out.with_name("rows.timeline.csv"))
    plan_ops = sum(len(p) for p in build("binomial", W2, resolve("cpu:ranks=2"), chunks=2).programs)
    assert len(timeline) == plan_ops and set(timeline["rank"]) == {0, 1}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_rows_that_cannot_be_written_are_printed_before_the_error(tmp_path):
    # A disk that filled up during the run (/dev/full: it opens, and every write fails) lost the
    # measurements: the command exited 2 without printing them.
    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2")))
    for json_out in (False, True):
        args = [TREEATTN, "run", str(path), "--repeats", "2", "--warmup", "0", "--out", "/dev/full",
                *(["--json"] if json_out else [])]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        shown = "the rows are" if json_out else "the rows printed above (their summary, without each run's time) are"
        assert proc.stderr.endswith(f"error: cannot write --out '/dev/full': No space left on device; {shown} not "
                                    "written\n"), proc.stderr
        if json_out:
            data = json.loads(proc.stdout)
            assert data["rows_csv"] is None and [r["method"] for r in data["rows"]] == ["plan"]
        else:
            assert "│ plan " in proc.stdout and proc.stdout.rstrip().endswith("Rows: not written"), proc.stdout
    # The rows written, the timeline not: said so (it said the rows were not written).
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "r.timeline.csv").symlink_to("/dev/full")
    args = [TREEATTN, "run", str(path), "--repeats", "2", "--warmup", "0", "--out", "out/r.csv", "--json"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.endswith("; the rows are in out/r.csv, the timeline is not "
                                                         "written\n"), proc.stderr
    data = json.loads(proc.stdout)
    assert (data["rows_csv"], data["timeline_csv"]) == ("out/r.csv", None)
    assert len(pd.read_csv(tmp_path / "out" / "r.csv")) == 1


def test_run_under_torchrun(tmp_path):
    # Each torchrun worker is one rank and runs in-process; only rank 0 prints the rows.
    path = plan_file(tmp_path, build("butterfly", W2, resolve("cpu:ranks=2")))
    args = [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "2", "--no-python", TREEATTN, "run",
            str(path), "--repeats", "2", "--warmup", "0", "--json", "--out", str(tmp_path / "r.csv")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert len(rows) == 1 and rows[0]["correct"] is True and rows[0]["algorithm"] == "butterfly"


def test_run_table_warns_on_other_topology_and_fails_loudly_on_a_dead_rank(tmp_path, monkeypatch):
    plan = build("star", W2, TopologyRef("elsewhere", "sha256:feedfeedfeedfeed"))
    path = plan_file(tmp_path, plan)
    monkeypatch.chdir(tmp_path)
    ok = run_cli("run", str(path), "--repeats", "2", "--warmup", "0")
    assert ok.exit_code == 0, ok.stderr
    assert "warning:" in ok.stderr and "elsewhere" in ok.stderr
    assert "× plan" in ok.stdout and "yes" in ok.stdout and "predicted" in ok.stdout
    assert len(list((tmp_path / "results" / "runs").glob("*-plan.csv"))) == 1
    monkeypatch.setenv(FAULT_ENV, "1:1:exit")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = run_cli("run", str(path), "--repeats", "2", "--warmup", "0")
    assert dead.exit_code == 1
    assert "rank 1 died with exit code 17" in dead.stderr
    assert "Traceback" not in dead.stderr
    # The ranks' whole output stays for the user to read, and the error says where.
    (kept,) = tmp_path.glob("treeattn-run-*")
    assert dead.stderr.rstrip().endswith(f"every rank's output is kept in {kept}")
    assert sorted(p.name for p in kept.glob("rank*.log")) == ["rank0.log", "rank1.log"]
    assert not list(kept.glob("*.pkl"))


def test_corrupt_and_invalid_plans_are_refused_before_launch(tmp_path, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr(launch_mod, "launch", no_launch)
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: treeattn-plan\nversion: 1\nalgorithm: [\n")
    res = run_cli("run", str(bad))
    assert res.exit_code == 2 and "bad.yaml" in res.stderr and "Traceback" not in res.stderr
    # Parses, but rank 1's partial would be merged twice: the validator refuses it.
    w = Workload(batch=1, q_heads=2, kv_heads=2, head_dim=4, split=(3, 3), kv_dtype="fp32")
    programs = ((Op(OpKind.COMPUTE, 0), Op(OpKind.RECV_MERGE, 1, peer=1), Op(OpKind.RECV_MERGE, 2, peer=1)),
                (Op(OpKind.COMPUTE, 0), Op(OpKind.SEND, 1, peer=0), Op(OpKind.SEND, 2, peer=0)))
    invalid = plan_file(tmp_path, Plan("star", {}, w, TopologyRef("t", "f"), 1, programs, (0,)), "twice.yaml")
    res = run_cli("run", str(invalid))
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("timeout", ["inf", "1e14", "1e10"])
def test_a_timeout_no_deadline_can_hold_is_refused_before_launch(tmp_path, monkeypatch, timeout):
    # Before, each rank failed on it (OverflowError) after the ranks had started; then it was
    # refused once torch was imported, in words other than the flag's.
    def no_launch(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr(launch_mod, "launch", no_launch)
    path = plan_file(tmp_path, build("star", W2, resolve("cpu:ranks=2")))
    for flag in ("--timeout", "--setup-timeout"):
        res = run_cli("run", str(path), flag, timeout, "--out", str(tmp_path / "r.csv"))
        assert res.exit_code == 2, res.stderr
        assert res.stderr.strip() == f"error: treeattn run: {flag} must be at most 1e+09, got {timeout!r} (see --help)"


@pytest.mark.parametrize("flag", ["--repeats", "--warmup"])
def test_iteration_counts_past_the_bound_are_refused_at_the_flag(tmp_path, flag):
    path = plan_file(tmp_path, build("star", W2, resolve("cpu:ranks=2")))
    res = run_cli("run", str(path), flag, "10000000000000000000000", "--out", str(tmp_path / "r.csv"))
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"{flag} must be at most 1000000, got '10000000000000000000000'" in res.stderr, res.stderr
    assert not (tmp_path / "r.csv").exists()


def test_rank_count_mismatch_under_torchrun_exits_2(tmp_path, monkeypatch):
    path = plan_file(tmp_path, build("star", W2, TopologyRef("t", "f")))
    for key, value in {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29999", "TORCHELASTIC_RUN_ID": "t"}.items():
        monkeypatch.setenv(key, value)
    res = run_cli("run", str(path))
    assert res.exit_code == 2
    assert "torchrun started 3 processes but the plan has 2 ranks" in res.stderr


def test_wrong_result_is_reported_and_exits_1(tmp_path, monkeypatch):
    path = plan_file(tmp_path, build("star", W2, resolve("cpu:ranks=2")))
    wrong = Measurement("plan.yaml", "plan", "explicit", (10.0, 12.0), max_rel_err=0.3, tolerance=1e-5,
                        checked_ranks=(0,))
    monkeypatch.setattr(launch_mod, "launch", lambda job, **kw: JobResult((wrong,), "gloo", "cpu", 2))
    res = run_cli("run", str(path), "--out", str(tmp_path / "r.csv"))
    assert res.exit_code == 1
    assert "wrong result from plan (max relative error 0.3, tolerance 1e-05)" in res.stderr
    assert "NO" in res.stdout
    assert pd.read_csv(tmp_path / "r.csv")["correct"].tolist() == [False]


def _signalled_run(tmp_path: Path, sig: str, *args: str, when: str = "timed runs",
                   times: int = 2) -> tuple[int, str, str, Path]:
    """``treeattn run`` of a 2-rank plan for 100,000 timed runs, sent ``sig`` once rank 0's
    progress (its run directory's file) has said ``when`` ``times`` times; returns its status, stdout and stderr
    and the temporary folder its run directory was made in. SIGINT's default action is restored in
    it: a background job's shell starts it ignored."""
    import signal
    import time

    from treeattn.exec.worker import read_progress

    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2")))
    runs = tmp_path / "tmp"
    runs.mkdir()
    env = {**os.environ, "TMPDIR": str(runs)}
    proc = subprocess.Popen([TREEATTN, "run", str(path), "--repeats", "100000", "--out", str(tmp_path / "rows.csv"),
                             *args], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    seen = set()
    while time.monotonic() < deadline:
        seen |= {g for g in map(read_progress, runs.glob("treeattn-run-*")) if g is not None and g[2].startswith(when)}
        # twice (rank 0 writes every half second): the launcher, which looks every 20 ms, has seen it
        if len(seen) >= times:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail(f"the ranks never reached {when!r}: {proc.communicate()[1]}")
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err, runs


def _nothing_left(runs: Path) -> None:
    assert list(runs.iterdir()) == []
    left = subprocess.run(["pgrep", "-f", str(runs)], capture_output=True, text=True)
    assert left.stdout == "", left.stdout


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_run_stopped_by_a_signal_keeps_the_runs_done(tmp_path, sig, status):
    # Ctrl-C, `timeout 60 treeattn run ...`, a batch system ending the job (SIGTERM) or a closed
    # terminal (SIGHUP) while the methods are timed: the ranks stop together before one run and
    # the rows over the runs done are written (before, every measurement was lost); the command
    # exits 128 + the signal, its ranks and run directory gone.
    status_got, out, err, runs = _signalled_run(tmp_path, sig, "--warmup", "0", "--json")
    assert status_got == status, err
    rows = pd.read_csv(tmp_path / "rows.csv")
    assert rows["method"].tolist() == ["plan"] and rows["correct"].all()
    (line,) = [ln for ln in err.splitlines() if ln.startswith("interrupted")]
    assert line.startswith(f"interrupted by {sig} before its last timed run: its rows are over the timed runs done "
                           "(plan "), err
    done = int(line.split("(plan ")[1].split()[0])
    assert 0 < done < 100000 and line.endswith(f" of 100000); rows in {tmp_path / 'rows.csv'}"), line
    assert rows["timed_runs"].tolist() == [done]
    assert json.loads(out)["interrupted"] == {"signal": sig, "timed_runs": {"plan": [done, 100000]}, "untimed": []}
    assert "aborted" not in err, err
    _nothing_left(runs)


def test_a_run_stopped_as_it_warms_up_keeps_nothing_and_says_aborted(tmp_path):
    # Before its first timed run there is nothing to keep: it ends at once, as it always did.
    status, _, err, runs = _signalled_run(tmp_path, "SIGTERM", "--warmup", "100000", when="starting", times=1)
    assert status == 143, err
    assert err.strip().splitlines()[-1] == "aborted", err
    assert not (tmp_path / "rows.csv").exists()
    _nothing_left(runs)


def test_a_run_stopped_in_blocked_order_names_the_methods_it_never_timed(tmp_path):
    # One method after another: a signal during the plan's runs leaves the baselines untimed,
    # which the line names (it said the rows were whole: every method it had rows of was).
    status, out, err, runs = _signalled_run(tmp_path, "SIGTERM", "--warmup", "0", "--order", "blocked",
                                            "--baselines", "--json")
    assert status == 143, err
    assert pd.read_csv(tmp_path / "rows.csv")["method"].tolist() == ["plan"]
    untimed = json.loads(out)["interrupted"]["untimed"]
    assert untimed == ["allreduce3", "allreduce2", "allgather-merge", "ring-attention"], out
    assert f"; not timed: {', '.join(untimed)}; rows in " in err, err
    _nothing_left(runs)


@pytest.mark.parametrize("where", ["_watch", "launch", "emit_results"])
def test_a_signal_as_the_ranks_end_keeps_the_whole_rows(tmp_path, monkeypatch, where):
    # The ranks have finished every run and the launcher is reading their result, or the command
    # is about to write the rows, when SIGTERM comes: before, the signal was dropped (status 0)
    # or the rows lost; the rows are whole, and the status and --json say the signal.
    import signal

    from treeattn.cli import run as run_mod

    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2")))
    module = run_mod if where == "emit_results" else launch_mod
    real = getattr(module, where)

    def then_signalled(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the wrapped function's signature
        got = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0.1)  # the handler runs at the next bytecode; this is only in case
        return got

    monkeypatch.setattr(module, where, then_signalled)
    res = run_cli("run", str(path), "--repeats", "3", "--warmup", "0", "--json", "--out", str(tmp_path / "rows.csv"))
    assert res.exit_code == 143, res.stderr
    assert f"interrupted by SIGTERM after its last timed run: its rows are whole; rows in {tmp_path / 'rows.csv'}" \
        in res.stderr, res.stderr
    if where != "emit_results":  # printed before the signal came: said on stderr and in the status only
        assert json.loads(res.stdout)["interrupted"] == {"signal": "SIGTERM", "timed_runs": {"plan": [3, 3]},
                                                         "untimed": []}
    assert pd.read_csv(tmp_path / "rows.csv")["timed_runs"].tolist() == [3]


def test_a_stop_before_the_plans_first_timed_run_prints_the_baselines_rows(tmp_path, monkeypatch):
    # Interleaved rounds are shuffled: a stop in the first may come before the plan's first timed
    # run. The table's "x plan" column has nothing to divide by (it raised IndexError).
    import signal

    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2")))
    done = Measurement("plan.yaml", "allreduce3", "explicit", (10.0, 12.0), max_rel_err=1e-7, tolerance=1e-5,
                       checked_ranks=(0,))
    monkeypatch.setattr(launch_mod, "launch", lambda job, **kw: JobResult(
        (done,), "gloo", "cpu", 2, stopped=signal.SIGTERM, repeats=(10,),
        untimed=("plan", "allreduce2", "allgather-merge", "ring-attention")))
    res = run_cli("run", str(path), "--baselines", "--out", str(tmp_path / "r.csv"))
    assert res.exit_code == 143, res.stderr
    assert "allreduce3" in res.stdout and "—" in res.stdout and "Traceback" not in res.stderr
    assert ("interrupted by SIGTERM before its last timed run: its rows are over the timed runs done (allreduce3 2 of "
            "10); not timed: plan, allreduce2, allgather-merge, ring-attention") in res.stderr, res.stderr
    assert pd.read_csv(tmp_path / "r.csv")["method"].tolist() == ["allreduce3"]


def _launched(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``treeattn run`` on a 2-rank plan as one process of an external launcher (``env``)."""
    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2"), chunks=2))
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
    full.update({"MASTER_ADDR": "127.0.0.1", "TMPDIR": str(tmp_path), **env})  # torch's kept log, if any, goes there
    return subprocess.run([TREEATTN, "run", str(path), "--out", str(tmp_path / "rows.csv"), *args], env=full,
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)


def test_a_run_signalled_in_its_set_up_stops_at_once(tmp_path):
    # Before the ranks measure there is nothing to keep, and a rank in its set-up may wait in
    # C++ (gloo's connection of the ranks), where the request would reach it only at the
    # deadline: the launcher stops them at once, as it always did.
    import signal
    import time

    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2")))
    runs = tmp_path / "tmp"
    runs.mkdir()
    proc = subprocess.Popen([TREEATTN, "run", str(path), "--warmup", "100000", "--out", str(tmp_path / "rows.csv")],
                            env={**os.environ, "TMPDIR": str(runs)}, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(runs.glob("treeattn-run-*/rank1.log")) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "aborted", err
    assert "stopping the ranks" not in err, err
    assert not (tmp_path / "rows.csv").exists()
    _nothing_left(runs)


def test_ranks_of_a_launcher_stop_together_when_one_is_signalled(tmp_path):
    # Under torchrun or SLURM each rank is a `treeattn run` of its own and gets the signal
    # itself; here only rank 1 does: it passes the request on at the next run's start, both stop
    # before the same run, and rank 0 writes the rows of the runs done.
    import signal

    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2")))
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
    full.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(launch_mod.free_port()), WORLD_SIZE="2",
                TMPDIR=str(tmp_path))
    procs = [subprocess.Popen([TREEATTN, "run", str(path), "--repeats", "100000", "--warmup", "0", "--progress",
                               "--out", str(tmp_path / f"rows{r}.csv")], env={**full, "RANK": str(r)}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        line = ""
        while "timed runs" not in line:  # rank 0's progress, a line every 10 s off a terminal
            line = procs[0].stderr.readline()
            assert line, "rank 0 ended before its timed runs"
        procs[1].send_signal(signal.SIGTERM)
        (_, err0), (_, err1) = (p.communicate(timeout=60) for p in procs)
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 143, err0
    assert "interrupted by SIGTERM before its last timed run" in err0
    assert procs[1].returncode == 143 and "interrupted" not in err1, err1  # rank 0 writes and says it
    assert pd.read_csv(tmp_path / "rows0.csv")["method"].tolist() == ["plan"]
    assert not (tmp_path / "rows1.csv").exists()


def test_a_slurm_task_out_of_range_exits_2_at_once(tmp_path):
    # srun started more tasks than SLURM_NTASKS says, say: before, task 2 waited for the
    # rendezvous for the whole set-up deadline (120 s), then failed with a traceback.
    proc = _launched(tmp_path, {"SLURM_PROCID": "2", "SLURM_NTASKS": "2", "MASTER_PORT": "29500"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["error: SLURM_PROCID=2 is not a rank of SLURM_NTASKS=2: it must be 0 "
                                                "to 1"], proc.stderr


def test_a_master_addr_that_does_not_resolve_is_said_early_and_given_up_on_at_the_deadline(tmp_path):
    # A mistyped MASTER_ADDR: every rank says within seconds that it waits for the name (a new
    # host's DNS record may come after its peers), and names it at the deadline; before, rank
    # 0 said only that it was "still reaching the rendezvous store" past its deadline.
    import socket

    try:  # '.invalid' never resolves (RFC 6761), where this host's resolver answers at all
        socket.getaddrinfo("rank0.invalid", None)
    except socket.gaierror as exc:
        if exc.errno != socket.EAI_NONAME:
            pytest.skip(f"this host's resolver does not answer ({exc.strerror})")
    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2"), chunks=2))
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
    procs = [subprocess.Popen([TREEATTN, "run", str(path), "--out", str(tmp_path / f"rows{r}.csv"), "--setup-timeout",
                               "7"], env={**full, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "rank0.invalid",
                                          "MASTER_PORT": "29500", "TMPDIR": str(tmp_path)},
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    for r, proc in enumerate(procs):
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err
        lines = [ln for ln in err.strip().splitlines() if not ln.startswith("note:")]
        assert lines == [
            f"warning: rank {r}: MASTER_ADDR=rank0.invalid does not resolve (name or service not known); waiting for "
            "it until the 7 s set-up deadline (a mistyped name? Ctrl-C stops)",
            f"error: rank {r} could not resolve MASTER_ADDR=rank0.invalid within the 7 s set-up deadline: name or "
            "service not known (a mistyped host name, or one whose DNS record never came; treeattn run takes a longer "
            "deadline with --setup-timeout)"], err


def test_a_torch_failure_under_a_launcher_is_one_line_not_a_traceback(tmp_path):
    # Rank 0 serves the rendezvous on MASTER_PORT; here something else holds that port.
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _launched(tmp_path, {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": str(port)}, "--timeout", "5")
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [errors[0]] and "rank 0 failed: DistNetworkError:" in errors[0], proc.stderr
    assert "EADDRINUSE" in errors[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "rows.csv").exists()


def test_ranks_that_never_connect_are_named_in_one_line(tmp_path):
    # SLURM_NTASKS=2 but only task 0 started: before, torch's store counted them ("only 1 of 2
    # ranks connected"), and which was missing was not said.
    code = ("from treeattn.exec.launch import launch\n"
            "from treeattn.exec.runner import Job, PlanJob, RunOptions\n"
            "from treeattn.plan.builders import build\nfrom treeattn.topology.library import resolve\n"
            "from treeattn.workload import Workload\n"
            "w = Workload(batch=2, q_heads=4, kv_heads=2, head_dim=8, split=(9, 0), kv_dtype='fp32')\n"
            "plan = build('star', w, resolve('cpu:ranks=2'))\n"
            "try:\n"
            "    launch(Job((PlanJob('p', plan),), RunOptions(repeats=1, warmup=0, setup_timeout_s=1)))\n"
            "except Exception as exc:\n"
            "    print(type(exc).__name__, exc)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
    env.update(SLURM_PROCID="0", SLURM_NTASKS="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(launch_mod.free_port()))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert proc.stdout.strip() == ("ExecutionError rank 1 of 2 did not connect within the 1 s set-up deadline (rank 0 "
                                   "waited; a rank that never connected hung, died or was not started; treeattn run "
                                   "takes a longer deadline with --setup-timeout)"), proc.stdout + proc.stderr


@pytest.mark.parametrize("crossed", [False, True])
def test_ranks_that_differ_by_design_are_a_note_and_others_a_warning(tmp_path, monkeypatch, crossed):
    # Ring attention's ranks each merge the blocks in their own order, as does a plan whose
    # groups cross (treeattn verify says so of it); an all-reduce's ranks must agree.
    w6 = Workload(batch=1, q_heads=4, kv_heads=2, head_dim=8, split=(3,) * 6, kv_dtype="fp32")
    groups = [[0, 5], [1, 3], [2, 4]] if crossed else [[0, 1], [2, 3], [4, 5]]
    path = plan_file(tmp_path, build("direct", w6, resolve("cpu:ranks=6"), groups=groups))

    def measured(method: str, same_bits: bool) -> Measurement:
        return Measurement("plan.yaml", method, "sdpa", (10.0, 12.0), max_rel_err=1e-7, tolerance=1e-5,
                           checked_ranks=(0,), same_bits=same_bits)

    got = (measured("plan", False), measured("allreduce3", False), measured("ring-attention", False))
    monkeypatch.setattr(launch_mod, "launch", lambda job, **kw: JobResult(got, "gloo", "cpu", 6))
    res = run_cli("run", str(path), "--baselines", "--out", str(tmp_path / "r.csv"))
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert ("note: ring-attention's ranks ended with different bits, as expected: each rank merges the ring's "
            "blocks in its own order, its own block first") in lines
    plan_note = ("note: plan's ranks ended with different bits, as expected: its ranks merge the same partials in "
                 "other orders or groupings (chunk 0: ranks 0,1,2 | 3,4,5)")
    assert (plan_note in lines) is crossed
    warning = "warning: ranks ended with different bits (every rank holds the result): "
    assert lines[-1] == warning + ("allreduce3" if crossed else "plan, allreduce3")


def test_a_rank_whose_peers_never_start_gives_up_at_the_setup_timeout_given(tmp_path):
    # One process of a 2-rank torchrun job whose peer never starts: it waits --setup-timeout
    # (many nodes or a slow scheduler need more than the default, a quick check less).
    import time

    t = time.monotonic()
    res = _launched(tmp_path, {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "t",
                               "MASTER_PORT": str(launch_mod.free_port())}, "--setup-timeout", "3")
    assert res.returncode == 1, res.stderr
    assert "error: rank 1 of 2 did not connect within the 3 s set-up deadline" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert time.monotonic() - t < 25
    # torch's log of it, which the message does not name, is not left behind (TMPDIR is tmp_path)
    assert not list(tmp_path.glob("treeattn-rank*-rendezvous-*.log"))
    refused = run_cli("run", str(tmp_path / "none.yaml"), "--setup-timeout", "0")
    assert refused.exit_code == 2 and "--setup-timeout" in refused.stderr


def test_a_launched_rank_that_cannot_reach_its_master_says_so_in_one_line(tmp_path):
    # Rank 1 of a torchrun job whose master nobody listens on: one line naming the address and
    # the deadline (before, torch's own error, its store's dozens of lines of C++ frames kept in a file).
    port = launch_mod.free_port()
    res = _launched(tmp_path, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "t",
                               "MASTER_PORT": str(port)}, "--setup-timeout", "1")
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"error: rank 1 could not reach the rendezvous at 127.0.0.1:{port} "
                               "(MASTER_ADDR:MASTER_PORT) within the 1 s set-up deadline: connection refused ("), lines
    assert lines[0].endswith("treeattn run takes a longer deadline with --setup-timeout)"), lines


_ALONE = ("import sys, time\n"
          "from treeattn.exec.launch import launch\n"
          "from treeattn.exec.runner import Job, PlanJob, RunOptions\n"
          "from treeattn.plan.builders import build\nfrom treeattn.topology.library import resolve\n"
          "from treeattn.workload import Workload\n"
          "w = Workload(batch=2, q_heads=4, kv_heads=2, head_dim=8, split=(9, 0), kv_dtype='fp32')\n"
          "job = Job((PlanJob('p', build('star', w, resolve('cpu:ranks=2'))),),\n"
          "          RunOptions(repeats=1, warmup=0, setup_timeout_s=float(sys.argv[1])))\n"
          "t = time.monotonic()\n"
          "try:\n"
          "    launch(job)\n"
          "except Exception as exc:\n"
          "    print(f'{time.monotonic() - t:.3f}', type(exc).__name__, exc)\n")
"""A rank under a launcher, timed from its start of ``launch`` (not the interpreter's)."""


def test_a_launched_rank_that_cannot_reach_its_master_gives_up_once_at_the_setup_timeout(tmp_path):
    # Torch's store client retries a connection that timed out, after a random back-off, with
    # the whole timeout again: rank 1 gave up after 1.3 to 2.7 times --setup-timeout.
    setup = 5.0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
    env.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", TMPDIR=str(tmp_path),
               MASTER_PORT=str(launch_mod.free_port()))
    proc = subprocess.run([sys.executable, "-c", _ALONE, str(setup)], env=env, capture_output=True, text=True,
                          timeout=60)
    took, _, error = proc.stdout.strip().partition(" ")
    assert setup <= float(took) < setup + 1.0, proc.stdout + proc.stderr
    assert error.startswith("ExecutionError rank 1 could not reach the rendezvous at "), proc.stdout


def test_a_launched_rank_whose_peer_joins_late_and_hangs_gives_up_once_at_the_setup_timeout(tmp_path):
    # Rank 1 joins rank 0's store late in the deadline, then never connects its process group:
    # before, gloo's connection of the ranks waited the whole --setup-timeout again (1.75x here);
    # and then the error was torch's, naming no rank (rank 1 never says it came: it is named).
    import time

    from torch.distributed import TCPStore

    setup, port = 4.0, launch_mod.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
    env.update(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               TMPDIR=str(tmp_path))
    path = plan_file(tmp_path, build("star", W2, resolve("cpu:ranks=2")))
    rank0 = subprocess.Popen([TREEATTN, "run", str(path), "--out", str(tmp_path / "rows.csv"), "--setup-timeout",
                              str(setup)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        give_up = time.monotonic() + 60
        while True:  # until rank 0 serves the store: its set-up has begun
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < give_up and rank0.poll() is None, "rank 0 never served its store"
                time.sleep(0.02)
        served = time.monotonic()
        time.sleep(0.75 * setup)
        late = TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=setup))
        _, err = rank0.communicate(timeout=60)
        took = time.monotonic() - served
        del late
    finally:
        rank0.kill()
        rank0.communicate()
    assert rank0.returncode == 1, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("error: rank 1 of 2 did not connect within the 4 s set-up deadline "), err
    assert took < 1.5 * setup, (took, err)


def test_a_launched_rank_whose_peer_hangs_exits_at_its_op_timeout_not_the_setup_timeout(tmp_path):
    # Rank 1 hangs, alive, in a timed iteration; rank 0's all-gather with it gives up after
    # --timeout. Before, rank 0 printed the error and then sat in the interpreter's exit, tearing
    # down a process group whose all-gather was still pending, for the whole --setup-timeout.
    import time

    path = plan_file(tmp_path, build("allgather-merge", W2, resolve("cpu:ranks=2")))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(launch_mod.free_port()), WORLD_SIZE="2",
               **{FAULT_ENV: "1:6:hang"})
    args = [TREEATTN, "run", str(path), "--repeats", "5", "--timeout", "2", "--setup-timeout", "90"]
    procs = [subprocess.Popen([*args, "--out", str(tmp_path / f"rows{r}.csv")], env={**env, "RANK": str(r)},
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        t = time.monotonic()
        _, err = procs[0].communicate(timeout=60)
        assert time.monotonic() - t < 40, err
        assert procs[0].returncode == 1, err
        assert err.splitlines()[-1].startswith("error: rank 0: "), err
        assert "Traceback" not in err
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


def test_a_run_directory_that_cannot_be_written_ends_the_run_in_one_line(tmp_path):
    # A full disk or a file-size limit where the ranks' job file goes: one line, exit 1, before
    # any rank starts, and no run directory left.
    import resource

    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2"), chunks=2))
    runs = tmp_path / "tmp"
    runs.mkdir()

    def tiny_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    res = subprocess.run([TREEATTN, "run", str(path), "--out", str(tmp_path / "rows.csv")], cwd=tmp_path,
                         env={**os.environ, "TMPDIR": str(runs)}, preexec_fn=tiny_files, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines()[-1].startswith(f"error: cannot write the run's job file {runs}/treeattn-run-")
    assert "Traceback" not in res.stderr and list(runs.iterdir()) == []


def test_rows_sent_to_the_null_device_leave_no_file_beside_it(tmp_path):
    # The timeline goes beside the rows: beside /dev/null, as root, it made /dev/null.timeline.csv.
    stray = Path("/dev/null.timeline.csv")
    assert not stray.exists()
    path = plan_file(tmp_path, build("binomial", W2, resolve("cpu:ranks=2")))
    try:
        proc = subprocess.run([TREEATTN, "run", str(path), "--repeats", "1", "--warmup", "0", "--json",
                               "--out", "/dev/null"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["timeline_csv"] is None
        assert not stray.exists()
        assert Path("/dev/null").is_char_device()
    finally:
        stray.unlink(missing_ok=True)


def test_slurm_tasks_given_different_plans_exit_2_on_every_rank(tmp_path):
    # srun with a plan file that differs between nodes (regenerated on one, say): before, the
    # ranks exchanged mismatched messages; rank 0 aborted inside gloo ("Received data size
    # doesn't match expected size", exit 134) and rank 1 waited out the set-up deadline (120 s).
    topo = resolve("cpu:ranks=2")
    paths = [plan_file(tmp_path, build("binomial", w, topo, chunks=2), f"plan{r}.yaml")
             for r, w in enumerate((W2, Workload(batch=2, q_heads=4, kv_heads=2, head_dim=8, split=(9, 9),
                                                 kv_dtype="fp32")))]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC", FAULT_ENV)) and k not in ("RANK", "WORLD_SIZE")}
    env.update(SLURM_NTASKS="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(launch_mod.free_port()))
    procs = [subprocess.Popen([TREEATTN, "run", str(paths[r]), "--out", str(tmp_path / f"rows{r}.csv")],
                              env={**env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=60)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [2, 2], outs
    for text in outs:
        errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "rank 1 differs" in errors[0] and "Traceback" not in text, text
