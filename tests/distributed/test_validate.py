"""``treeattn validate`` end to end on a tiny emulated cluster (2 ranks of emu-2x4: one NIC hop
each way), then ``treeattn report`` on what it wrote. Timings are never asserted.

Marked ``netns``; skipped without root or iproute2.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from tests.distributed.netns_skip import NETNS
from treeattn.emulate.cluster import STATE_DIR
from treeattn.emulate.netns import list_namespaces
from treeattn.report import ROW_COLUMNS, load_folder
from treeattn.topology.library import resolve
from treeattn.validate import CalibrationSettings, TopologyTarget, ValidateOptions, default_cases, validate
from treeattn.validate.run import case_rounds

pytestmark = NETNS

TREEATTN = str(Path(sys.executable).with_name("treeattn"))


def _ours() -> tuple[set[str], set[str]]:
    nss = {ns for ns in list_namespaces() if ns.startswith("ta-")}
    states = {p.name for p in STATE_DIR.glob("*.json")} if STATE_DIR.is_dir() else set()
    return nss, states


def test_tiny_validate_end_to_end(tmp_path: Path):
    before = _ours()
    full = resolve("emu-2x4")
    topo = dataclasses.replace(full, name="emu-2x4[ranks 0,4]", ranks=(full.ranks[0], full.ranks[4]))
    cases = tuple(default_cases(topo, batches=(1,), heads_batches=(4,), long_tokens_per_rank=0))
    options = ValidateOptions(repeats=2, case_seconds=0.2, warmup=0, families=("star", "butterfly"), op_timeout_s=60,
                              job_timeout_s=300, reuse=False,
                              calibration=CalibrationSettings(max_bytes=64 << 10, sizes=4, repeats=3, warmup=0,
                                                                  compute="merge"))
    out = tmp_path / "res"
    runs = validate([TopologyTarget(topo, cases, source="test")], out, options, command="pytest")
    assert _ours() == before  # namespaces and state files of the run are gone

    rows = pd.read_csv(out / "rows.csv")
    assert list(rows.columns) == list(ROW_COLUMNS)
    assert sorted(set(rows["case"])) == ["B1", "B4-heads"]
    baselines = {"B1": {"allreduce3", "allreduce2", "allgather-merge", "ring-attention"},
                 "B4-heads": {"allreduce2", "dcp-ag-rs", "dcp-a2a", "ring-attention"}}
    for case, grp in rows.groupby("case"):
        assert set(grp.loc[grp["role"] == "baseline", "method"]) == baselines[case]
        assert grp["is_pick"].sum() == 1
        assert set(grp.loc[grp["role"] == "candidate", "method"]) <= {"star", "butterfly", "star+butterfly",
                                                                      *grp.loc[grp["is_pick"], "method"]}
    assert rows["correct"].all()
    assert (rows["predicted_us"] > 0).all() and (rows["measured_median_us"] > 0).all()
    for _, grp in rows.groupby("case"):  # a case's rounds: as many as its predicted times fit in 0.2 s
        assert set(grp["repeats"]) == {case_rounds(options, grp["predicted_us"].sum())}
    assert all(len(str(c).split()) == n for c, n in zip(rows["measured_times_us"], rows["repeats"], strict=True))

    meta = json.loads((out / "meta.json").read_text())
    assert meta["primary_topology"] == topo.name and meta["command"] == "pytest"
    t = meta["topologies"][0]
    assert t["predicted_on"]["calibration"].startswith("treeattn calibrate")
    assert (out / "calibration" / "emu-2x4_ranks_0_4_.yaml").is_file()
    assert runs[0].predicted_on.fingerprint == t["predicted_on"]["fingerprint"] != topo.fingerprint
    for phase in ("calibration", "measurement"):  # what the host's CPUs did meanwhile
        assert 0 <= t["host_cpu"][phase]["steal"] <= 1 and 0 < t["host_cpu"][phase]["busy"] <= 1

    timeline = load_folder(out).timeline
    assert set(timeline["source"]) == {"measured", "predicted"}
    assert set(timeline["case"]) == {"B1", "B4-heads"}

    res = subprocess.run([TREEATTN, "report", str(out), "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["errors"]["all"]["n"] == len(rows)
    assert {p.name for p in out.iterdir()} >= {"rows.csv", "timeline.csv", "meta.json", "summary.json",
                                              "scatter.png", "speedup.png", "timeline.png", "calibration"}
