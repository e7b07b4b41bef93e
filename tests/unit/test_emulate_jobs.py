"""What emulated runs report: the rank that died, not the peer that lost it; the clusters up."""

from __future__ import annotations

import json
import os

from treeattn.emulate.jobs import _failure
from treeattn.emulate.spawn import RankResult

LOST = "rank 0: collective allgather merge partial (step 1) failed: Read error: Connection reset by peer"


def _lost_peer_report(tmp) -> None:  # noqa: ANN001 - a Path
    (tmp / "rank0.error.json").write_text(json.dumps({"rank": 0, "kind": "comm", "message": LOST, "exit_code": 1}))


def test_a_rank_killed_from_outside_is_named_as_the_cause(tmp_path) -> None:  # noqa: ANN001
    _lost_peer_report(tmp_path)
    results = (RankResult(0, 1, "", ""), RankResult(1, -9, "", ""))  # kill -9 (OOM killer, a user)
    message = str(_failure(tmp_path, results))
    assert message.startswith("rank 1 was killed by signal 9"), message
    assert message.endswith("(rank 0 was stopped)"), message


def test_a_rank_the_spawner_stopped_is_not_the_cause(tmp_path) -> None:  # noqa: ANN001
    _lost_peer_report(tmp_path)
    (tmp_path / "rank1.error.json").write_text(json.dumps(
        {"rank": 1, "kind": "error", "message": "ValueError: bad shard", "exit_code": 1}))
    results = (RankResult(0, -15, "", "", stopped=True), RankResult(1, 1, "", ""))
    message = str(_failure(tmp_path, results))
    assert message.startswith("rank 1 failed: ValueError: bad shard"), message


def test_status_shows_a_rank_selection_in_the_topologys_name(monkeypatch) -> None:  # noqa: ANN001
    from tests.cli_helpers import run_cli
    from treeattn import emulate

    cluster = {"run_id": "3570bf", "status": "ready", "condition": "ready", "topology": "emu-2x4[ranks 0,4]",
               "scale": 1.0, "live_namespaces": ["a", "b", "c"]}
    monkeypatch.setattr(emulate, "list_clusters", lambda: [cluster])
    res = run_cli("emulate", "status")
    assert res.exit_code == 0 and "emu-2x4[ranks 0,4]" in res.stdout, res.stdout
    # none up: said, not an empty table; --json stays a list
    monkeypatch.setattr(emulate, "list_clusters", lambda: [])
    res = run_cli("emulate", "status")
    assert res.exit_code == 0 and res.stdout == "no emulated cluster is up (treeattn emulate up TOPOLOGY starts one)\n"
    assert run_cli("emulate", "status", "--json").stdout.strip() == "[]"


def test_down_of_a_cluster_that_is_not_there_names_the_ones_that_are(monkeypatch) -> None:  # noqa: ANN001
    # Nothing real is listed or removed: the clusters on this host are others'.
    from tests.cli_helpers import run_cli
    from treeattn.emulate import cluster

    removed = []
    monkeypatch.setattr(cluster, "require_netns", lambda: None)
    monkeypatch.setattr(cluster, "_remove", lambda run_id, nss: removed.append(run_id) or ([], []))
    up = {"run_id": "3570bf", "status": "ready", "namespaces": [], "live_namespaces": []}
    monkeypatch.setattr(cluster, "list_clusters", lambda: [up])
    res = run_cli("emulate", "down", "--id", "abcdef")
    assert res.exit_code == 2 and res.stdout == "", res.stdout
    assert res.stderr == ("error: no emulated cluster abcdef on this machine; there are: 3570bf "
                          "(treeattn emulate status)\n"), res.stderr
    monkeypatch.setattr(cluster, "list_clusters", lambda: [])
    res = run_cli("emulate", "down", "--id", "abcdef", "--json")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == "error: no emulated cluster abcdef on this machine; there are none\n", res.stderr
    assert removed == []
    monkeypatch.setattr(cluster, "list_clusters", lambda: [up])
    res = run_cli("emulate", "down", "--id", "3570bf")
    assert res.exit_code == 0 and removed == ["3570bf"], res.stderr


def test_a_failed_run_whose_logs_cannot_be_written_is_reported_without_claiming_them(monkeypatch) -> None:  # noqa: ANN001
    import errno
    import glob
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    import pytest

    from treeattn.emulate import jobs
    from treeattn.errors import ExecutionError
    from treeattn.exec.runner import Job, PlanJob, RunOptions
    from treeattn.plan.builders import build
    from treeattn.topology.library import resolve
    from treeattn.workload import Workload

    w = Workload(batch=2, q_heads=4, kv_heads=2, head_dim=8, split=(9, 0), kv_dtype="fp32")
    job = Job((PlanJob("p", build("star", w, resolve("cpu:ranks=2"))),), RunOptions(repeats=1, warmup=0))
    cluster = SimpleNamespace(num_ranks=2, topology=SimpleNamespace(name="emu-test"))
    results = (RankResult(0, 1, "rank 0 out\n", ""), RankResult(1, -9, "", ""))
    monkeypatch.setattr(jobs, "run_in_namespaces", lambda *args, **kwargs: results)
    real_write = Path.write_text

    def full_disk(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if self.name.startswith("rank") and self.name.endswith(".log"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "treeattn-emu-run-*")))
    with pytest.raises(ExecutionError) as err:
        jobs.launch_in_cluster(cluster, job)
    assert "kept" not in str(err.value) and str(err.value).startswith("rank 0 died with exit code 1"), err.value
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "treeattn-emu-run-*"))) == before


def test_status_tells_what_became_of_a_cluster() -> None:
    from treeattn.emulate.cluster import _condition

    me = os.getpid()
    dead = _reaped_pid()
    made = ["ta-abcdef-r0", "ta-abcdef-r1", "ta-abcdef-sw"]
    live = set(made)
    assert _condition({"status": "ready", "pid": dead, "namespaces": made}, live) == "ready"  # up has ended: as meant
    assert _condition({"status": "creating", "pid": me, "namespaces": made}, live) == "creating"
    assert _condition({"status": "creating", "pid": dead, "namespaces": made}, live) == (
        f"broken (pid {dead} ended while making it; treeattn emulate down removes it)")
    assert _condition({"status": "ready", "pid": dead, "namespaces": made}, live - {made[1]}) == (
        "damaged (1 of 3 namespaces gone: ta-abcdef-r1; treeattn emulate down removes it)")
    assert _condition({"status": "ready", "pid": me, "held": True, "namespaces": made}, live) == f"in use by pid {me}"
    assert _condition({"status": "ready", "pid": dead, "held": True, "namespaces": made}, live) == (
        f"ready (left by pid {dead}, which ended without removing it)")
    assert _condition({"status": "orphaned", "namespaces": []}, live) == "orphaned"
    # a command that found it up and runs on it (its pid and start time; a pid reused is not it)
    from treeattn.emulate.cluster import _start_time

    mine = {"pid": me, "started": _start_time(me)}
    assert _condition({"status": "ready", "pid": dead, "user": mine, "namespaces": made}, live) == f"in use by pid {me}"
    reused = {"pid": me, "started": _start_time(me) + 1}
    assert _condition({"status": "ready", "pid": dead, "user": reused, "namespaces": made}, live) == "ready"
    assert _condition({"status": "ready", "pid": me, "started": _start_time(me) + 1, "held": True,
                       "namespaces": made}, live) == f"ready (left by pid {me}, which ended without removing it)"


def _reaped_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_down_of_every_run_leaves_one_a_live_command_holds() -> None:
    # A validate or emulate run in another shell removes its own cluster as it ends; `down`
    # of every run killed its ranks (a CI run's validate failed with status 143 that way).
    from treeattn.emulate.cluster import _removable

    me = os.getpid()
    known = {"aaaaaa": {"condition": "ready"}, "bbbbbb": {"condition": f"in use by pid {me}"},
             "cccccc": {"condition": "ready (left by pid 1, which ended without removing it)"},
             "dddddd": {"condition": "broken (pid 2 ended while making it; treeattn emulate down removes it)"}}
    removed, left = _removable(known, None)
    assert sorted(removed) == ["aaaaaa", "cccccc", "dddddd"] and left == ("bbbbbb",)
    assert _removable({"bbbbbb": known["bbbbbb"]}, "bbbbbb") == ({"bbbbbb": known["bbbbbb"]}, ())  # named: removed


def test_a_cluster_run_past_this_hosts_memory_is_refused_before_a_rank_starts(monkeypatch):
    # The namespaces' ranks all run on this host (emulate run, validate), as a local run's do.
    from types import SimpleNamespace

    import pytest

    from treeattn.emulate import jobs
    from treeattn.errors import InputError
    from treeattn.exec import launch
    from treeattn.exec.runner import Job, PlanJob, RunOptions
    from treeattn.plan.builders import build
    from treeattn.topology.library import resolve
    from treeattn.workload import RawPayload

    job = Job((PlanJob("star-1MiB", build("star", RawPayload(nbytes=1 << 20, ranks=2), resolve("cpu:ranks=2"))),),
              RunOptions(repeats=1, warmup=0))
    cluster = SimpleNamespace(num_ranks=2, topology=SimpleNamespace(name="emu-test"))
    monkeypatch.setattr(jobs, "run_in_namespaces", lambda *args, **kwargs: pytest.fail("a rank was started"))
    monkeypatch.setattr(launch, "available_bytes", lambda: 1)
    with pytest.raises(InputError, match=r"^star-1MiB: its 2 ranks hold at least .* on this host, which has 1 B "):
        jobs.launch_in_cluster(cluster, job)
