"""The pure parts of ``treeattn validate``: scaled cases, what each case measures, flag errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.errors import InputError
from treeattn.exec.deadline import MAX_ITERATIONS
from treeattn.search.search import FAMILIES
from treeattn.topology.library import resolve
from treeattn.validate import EMU_HEADS, HeadShape, ValidateOptions, case_plans, default_cases
from treeattn.validate.run import MAX_ROUNDS_FACTOR, case_rounds

ROOT = Path(__file__).resolve().parents[2]


def test_default_cases_are_scaled():
    topo = resolve("topologies/emu-2x4.yaml")
    cases = default_cases(topo)
    assert [c.name for c in cases] == ["B1", "B4", "B16", "B64", "B16-heads", "N64K"]
    b1, n64 = cases[0].workload, cases[-1].workload
    assert (b1.q_heads, b1.kv_heads, b1.head_dim) == (EMU_HEADS.q_heads, EMU_HEADS.kv_heads, EMU_HEADS.head_dim)
    assert b1.payload_bytes == 8 * 33 * 4 and cases[3].workload.payload_bytes == 64 * 8 * 33 * 4
    assert cases[-1].tokens_per_rank == 65536 and n64.kv_bytes(0) == 8 << 20
    assert [c.regime for c in cases] == ["sweep"] * 4 + ["heads", "long-context"]
    assert [c.result for c in cases] == ["all"] * 4 + ["heads", "all"]
    assert [c.name for c in default_cases(topo, batches=(2,), heads_batches=(), long_tokens_per_rank=0)] == ["B2"]


@pytest.mark.parametrize("bad", [dict(batches=()), dict(batches=(1, 1)), dict(tokens_per_rank=0)])
def test_bad_cases(bad):
    with pytest.raises(InputError):
        default_cases(resolve("emu-mesh"), **bad)
    with pytest.raises(InputError, match="KV heads dividing"):
        HeadShape(8, 3, 32)


def test_case_plans_pick_and_dedup():
    topo = resolve("emu-pcie-tree")
    case = default_cases(topo, batches=(16,), long_tokens_per_rank=0)[0]
    cp = case_plans(topo, case.workload)
    picks = [m for m in cp.methods if m.is_pick]
    assert len(picks) == 1
    names = [m.method for m in cp.methods]
    assert len(set(names)) == len(names)
    covered = {f for m in names for f in m.split("+")}
    assert covered <= set(FAMILIES) | {picks[0].method}
    keys = {(m.plan.chunks, m.plan.programs) for m in cp.methods}
    assert len(keys) == len(cp.methods)  # every method a different schedule
    best = min(m.plan.predicted_us for m in cp.methods)
    assert cp.pick.plan.predicted_us == pytest.approx(best) and cp.pick_predicted_us == pytest.approx(best)


def test_case_plans_unknown_family():
    topo = resolve("emu-mesh")
    with pytest.raises(InputError, match="unknown candidate families"):
        case_plans(topo, default_cases(topo)[0].workload, families=("nope",))


@pytest.mark.parametrize(("args", "match"), [
    (["--heads", "8/3/32"], "--heads '8/3/32': heads 8/3, dim 32: need positive numbers with the KV heads dividing"),
    (["--tokens", "0"], "--tokens '0': must be at least 1 token a rank"),
    (["--long-tokens", "-1"], "--long-tokens '-1': must be at least 0 tokens a rank"),
    (["--heads", "8x1"], "HQ/HKV/D"),
    (["--batches", "1,x"], "--batches"),
    (["--long-tokens", "lots"], "--long-tokens"),
    (["--families", "star,nope"], "unknown candidate families"),
    # an empty item is a slip, and an empty list is no list (it meant every family)
    (["--batches", "1,,2"], "--batches '1,,2': item 2 is empty; write positive integers separated by commas"),
    (["--families", ""], "--families '' names nothing"),
    (["--families", "star,"], "--families 'star,': item 2 is empty"),
    (["--families", "star,star"], "--families 'star,star' names star twice"),
    (["--batches", "1_6"], "--batches '1_6': item 1 ('1_6') is not an integer; write positive integers"),
    (["--batches", "1,0"], "--batches '1,0': item 2 (0) must be at least 1"),
    (["--batches", "4,1,4"], "--batches '4,1,4' names 4 twice"),
    # every topology's emulation is laid out before the first is measured
    (["--ranks", "0"], "places 1 rank: an emulated cluster is ranks joined by links"),
])
def test_validate_flag_errors(args, match, tmp_path):
    # Errors in the flags surface before anything is emulated (no root needed) or written.
    res = run_cli("validate", "emu-mesh", "--out", str(tmp_path / "o"), "--no-calibrate", *args)
    assert res.exit_code == 2, res.stderr
    assert match in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "o").exists()


def test_validate_calibrated_count(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text("x: 1\n")
    res = run_cli("validate", "emu-mesh", "emu-pcie-tree", "--calibrated", str(cal), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and "one per topology" in res.stderr


def test_validate_refuses_one_topology_twice_and_a_fit_of_another_machine(tmp_path):
    # emu-2x4 twice measured it twice into one rows.csv, each row doubled; a GPU machine's fit
    # was taken for the emulated CPU ranks without a word (median error 100 %).
    out = tmp_path / "o"
    res = run_cli("validate", "emu-mesh", str(ROOT / "topologies" / "emu-mesh.yaml"), "--out", str(out))
    assert res.exit_code == 2, res.stderr
    assert res.stderr == (f"error: topologies 'emu-mesh' and '{ROOT / 'topologies' / 'emu-mesh.yaml'}' are both "
                          "named 'emu-mesh', which tells their rows apart: give each machine once, under a name of "
                          "its own\n")
    from treeattn.topology.io import dump_topology

    for spec, said in (("dgx-h100", "a GPU machine's ('dgx-h100')"),
                       ("emu-2x4", "8 ranks' ('emu-2x4') where emu-mesh has 4")):
        fit = tmp_path / f"{spec}.yaml"
        fit.write_text(dump_topology(resolve(spec)))
        res = run_cli("validate", "emu-mesh", "--calibrated", str(fit), "--out", str(out))
        assert res.exit_code == 2, res.stderr
        assert res.stderr.startswith(f"error: --calibrated {fit}: a fit of {said}; validate measures "), res.stderr
    assert not out.exists()


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler") or os.geteuid() != 0, reason="needs root")
def test_realtime_priority_is_restored():
    from treeattn.validate.run import realtime_priority

    before = os.sched_getscheduler(0)
    with realtime_priority(True):
        assert os.sched_getscheduler(0) == os.SCHED_RR
    assert os.sched_getscheduler(0) == before
    with realtime_priority(False):
        assert os.sched_getscheduler(0) == before


def test_host_cpu_shares():
    from treeattn.report.render import _host_cpu
    from treeattn.validate.run import cpu_shares, cpu_ticks

    # user nice system idle iowait irq softirq steal
    shares = cpu_shares([100, 0, 50, 800, 0, 0, 10, 40], [150, 0, 80, 930, 0, 0, 40, 100])  # 300 ticks
    assert shares == {"steal": 0.2, "softirq": 0.1, "busy": pytest.approx(170 / 300, abs=1e-3)}
    assert cpu_shares(None, [1] * 8) is None and cpu_shares([1] * 8, [1] * 8) is None
    now = cpu_ticks()
    if os.path.exists("/proc/stat"):
        assert now is not None and len(now) == 8 and all(x >= 0 for x in now)
    line = _host_cpu({"calibration": None, "measurement": shares})
    assert line == "; measurement: CPU 57% busy, 20% stolen by the hypervisor, 10% in packet processing"
    assert _host_cpu(None) == ""


def test_cheap_cases_get_more_rounds_within_the_budget():
    opt = ValidateOptions(repeats=15, case_seconds=10.0)
    assert case_rounds(opt, 12e6) == 15  # a round dearer than the budget: the floor
    assert case_rounds(opt, 0.25e6) == 40  # 10 s of 0.25 s rounds
    assert case_rounds(opt, 1e3) == MAX_ROUNDS_FACTOR * 15  # capped
    assert case_rounds(ValidateOptions(repeats=15, case_seconds=0.0), 1e3) == 15
    # The runner refuses more than MAX_ITERATIONS timed runs once the ranks are up: a cheap
    # case's extra rounds stop there.
    big = ValidateOptions(repeats=MAX_ITERATIONS // 2, case_seconds=1e9)
    assert case_rounds(big, 1.0) == MAX_ITERATIONS
    assert case_rounds(ValidateOptions(repeats=MAX_ITERATIONS, case_seconds=1e9), 1.0) == MAX_ITERATIONS
    with pytest.raises(InputError):
        ValidateOptions(case_seconds=-1.0)
    res = run_cli("validate", "emu-mesh", "--out", "/nonexistent/o", "--no-calibrate", "--case-seconds", "-1")
    assert res.exit_code == 2 and "case-seconds" in res.stderr and "Traceback" not in res.stderr
