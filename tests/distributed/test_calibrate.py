"""``treeattn calibrate`` end to end on local gloo ranks (never asserts a timing)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from treeattn.calibrate.live import CalibrateOptions, calibrate
from treeattn.topology.io import load_topology
from treeattn.topology.library import resolve

TREEATTN = str(Path(sys.executable).with_name("treeattn"))


def _finite_positive(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_cli_end_to_end_on_two_ranks(tmp_path):
    out, png = tmp_path / "cpu2.yaml", tmp_path / "fit.png"
    args = [TREEATTN, "calibrate", "-t", "cpu:ranks=2", "--max-size", "16MiB", "--sizes", "3", "--repeats", "3",
            "--warmup", "0", "--round-trips", "1,2", "--compute", "sum", "--out", str(out), "--png", str(png),
            "--json"] + (["--realtime"] if os.geteuid() == 0 else [])
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (cls,) = report["classes"]
    assert cls["name"] == "loopback" and cls["pair"] == [0, 1]
    assert [p["nbytes"] for p in cls["points"]] == [4, 4, 8192, 8192, 1 << 24, 1 << 24]
    assert cls["alpha_us"] >= 0 and cls["skew_us"] >= 0 and _finite_positive(cls["beta_gbps"])
    assert all(_finite_positive(c["measured_us"]) and _finite_positive(c["predicted_us"]) for c in report["cases"])
    assert report["compute"]["kernel"] == "sum" and _finite_positive(report["compute"]["eff_bw_gbps"])
    # The written topology loads back, is the one reported, and carries positive, finite figures.
    topo = load_topology(out)
    assert topo.fingerprint == report["fingerprint"] and topo.num_ranks == 2
    (ln,) = topo.links
    assert _finite_positive(ln.bw_gbps) and math.isfinite(ln.latency_us) and ln.latency_us >= 0
    cost = topo.cost
    assert math.isfinite(cost.overhead_us) and _finite_positive(cost.launch_us + 1e-9)
    assert 0 < cost.mem_efficiency <= 1
    # CPU ranks: the host terms are fitted and written; one flow runs at the wire rate left of
    # beta once the receiver's copy is taken out, all flows together at least as fast.
    host = report["host"]
    assert cost.host.host_cores == host["cores"] >= 1 and cost.host.cpu_scope == "machine"
    assert cost.host.cpu_us == pytest.approx(host["cpu_us"]) and cost.host.wakeup_us == pytest.approx(host["wakeup_us"])
    copy_gbps = topo.devices[0].mem_bw_gbps * cost.mem_efficiency
    assert 1 / ln.flow_gbps == pytest.approx(1 / cls["beta_gbps"] - 2 / copy_gbps, rel=1e-6) or (
        ln.flow_gbps == pytest.approx(cls["beta_gbps"]))
    assert ln.bw_gbps >= ln.flow_gbps
    assert ln.latency_us == pytest.approx(max(0.0, cls["alpha_us"] - cost.launch_us - min(cost.host.cpu_us,
                                                                                          cls["alpha_us"])))
    # Every host term the fit left at a bound: one warning each, and one line each in the
    # written topology's sources.
    flags = [w for w in report["warnings"] if w.startswith("fit: ")]
    assert [w.split(": the cases")[0] for w in flags] == [f"fit: {a}" for a in host["at_bounds"]]
    assert [s for s in topo.sources if s.startswith("fit: ")] == flags
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_contention_cases_on_four_ranks():
    # Sizes far apart, so that the fit sees time grow with size however loaded the machine is.
    opt = CalibrateOptions(min_bytes=4, max_bytes=16 << 20, sizes=2, round_trips=(1, 2), repeats=1, warmup=0,
                           contention_sizes=(16 << 20,), compute="none")
    report = calibrate(resolve("cpu:ranks=4"), opt)
    kinds = sorted((c.kind, c.nbytes, c.flows) for c in report.cases)
    big = 16 << 20
    assert kinds == [("collective", 64, 4), ("collective", 16384, 4),
                     ("concurrent", big, 2), ("fanin", big, 1), ("fanin", big, 3),
                     ("pingpong", 4, 1), ("pingpong", 4, 1), ("pingpong", big, 1), ("pingpong", big, 1)]
    # host ranks: gloo's own cost per message end is fitted from the all-reduces
    assert report.host.coll_cpu_us is not None
    # Two pairs at once and a three-way fan-in share the loopback link in the model.
    by = {(c.kind, c.flows): c for c in report.cases if c.nbytes == big}
    assert by[("fanin", 3)].predicted_us > by[("fanin", 1)].predicted_us
    solo = next(c for c in report.cases if c.kind == "pingpong" and c.nbytes == big and c.round_trips == 2)
    # Two pairs share the link when the fitted aggregate is below two flows' worth; a noisy
    # single repeat can fit it above (then they do not contend, and must not be faster).
    ln = report.topology.links[0]
    if ln.bw_gbps < 2 * ln.flow_gbps:
        assert by[("concurrent", 2)].predicted_us > solo.predicted_us
    else:
        assert by[("concurrent", 2)].predicted_us >= solo.predicted_us
    assert report.topology.cost.launch_us == resolve("cpu:ranks=4").cost.launch_us  # --compute none keeps it


def test_times_that_do_not_grow_with_size_are_a_failed_measurement_not_bad_flags(monkeypatch):
    # Every flag is valid; what the ranks measured cannot be fitted: exit 1, as a failed run.
    from tests.cli_helpers import run_cli
    from treeattn.calibrate import live
    from treeattn.exec.runner import JobResult, Measurement

    def flat(job, progress=None):  # noqa: ANN001, ANN202, ARG001 - launch's signature
        return JobResult(tuple(Measurement(pj.label, "plan", "none", (100.0, 100.0), 0.0, 1e-5, (0,))
                               for pj in job.plans), "gloo", "cpu", 2)

    monkeypatch.setattr(live, "launch", flat)
    args = ("calibrate", "-t", "cpu:ranks=2", "--max-size", "4KiB", "--repeats", "2", "--no-contention",
            "--compute", "none")
    res = run_cli(*args, "--sizes", "2")
    assert res.exit_code == 1, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: ping-pong fit: time does not grow with size"), line
    # Flags that cannot be measured together are still bad input, refused before any rank starts.
    monkeypatch.setattr(live, "launch", lambda job, progress=None: pytest.fail("launched"))
    res = run_cli(*args, "--sizes", "2", "--min-size", "8KiB")
    assert res.exit_code == 2 and "--min-size and --max-size must satisfy" in res.stderr, res.stderr


def test_a_live_calibration_reports_its_progress(tmp_path, monkeypatch):
    # 64 ranks on a small host measure for minutes: off a terminal a line every
    # PROGRESS_EVERY_S (shortened here) says how far it got; none with --no-progress.
    from tests.cli_helpers import run_cli
    from treeattn.cli import progress as progress_cli

    monkeypatch.setattr(progress_cli, "PROGRESS_EVERY_S", 0.02)
    # sizes that fit a line on a busy host (as test_cli_end_to_end_on_two_ranks)
    args = ["calibrate", "-t", "cpu:ranks=2", "--max-size", "16MiB", "--sizes", "3", "--repeats", "3", "--warmup",
            "0", "--round-trips", "1", "--no-contention", "--compute", "sum", "--out", str(tmp_path / "fit.yaml")]
    res = run_cli(*args)
    assert res.exit_code == 0, res.stderr
    assert any(ln.startswith("calibrating: ") and " steps, " in ln for ln in res.stderr.splitlines()), res.stderr
    res = run_cli(*args, "--no-progress")
    assert res.exit_code == 0 and "calibrating: " not in res.stderr, res.stderr
    # The ranks' runs, then each stage of this process, in order, with the runs' last count.
    seen: list[tuple[int, int, str]] = []
    opt = CalibrateOptions(max_bytes=16 << 20, sizes=3, round_trips=(1,), repeats=3, warmup=0, contention=False,
                           compute="sum")
    calibrate(resolve("cpu:ranks=2"), opt, lambda done, total, what: seen.append((done, total, what)))
    stages = [what for _, _, what in seen if not what.startswith(("starting", "checked", "warm-up", "timed"))]
    assert stages == ["timing the sum kernel", "fitting the host terms through the simulator",
                      "predicting the measured plans on the fitted topology"], seen
