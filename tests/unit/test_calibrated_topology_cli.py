"""A topology calibrated from nccl-tests logs, through every command a user runs on it next:
each says which link rates its figures read (measured for point-to-point transfers, the
hardware's ratings for NCCL's collectives), and the ratings reach what they should."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

LOG = Path(__file__).parents[1] / "fixtures" / "nccl-tests" / "all_reduce_perf.8xh100-1node.txt"
NOTE = "NCCL's collectives at the hardware ratings kept (rated_gbps"


@pytest.fixture(scope="module")
def mine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("calibrated") / "mine.yaml"
    res = run_cli("calibrate", "--from-nccl-tests", str(LOG), "-t", "dgx-h100", "-o", str(out))
    assert res.exit_code == 0, res.stderr
    return out


def test_topo_show_gives_measured_and_rated_figures(mine):
    data = json.loads(run_cli("topo", "show", str(mine), "--json").stdout)
    nvlink = data["links"]["nvlink"]
    assert nvlink["rated_gbps"] == [450.0] and nvlink["rated_latency_us"] == [0.3]
    # The log's sizes (128 MiB-4 GiB) measure the rate but not the latency, which stays.
    assert nvlink["bw_gbps"] != [450.0] and nvlink["latency_us"] == [0.3]
    # PCIe is not measured: it keeps the rate a transfer reached on it at datasheet rates (NCCL's
    # rating of the link), a measured topology's rates being read as they are, and the datasheet
    # figure as its rating.
    from treeattn.cost.nccl_rates import transfer_gbps
    from treeattn.topology.library import resolve

    family = resolve("dgx-h100")
    reached = sorted({r for ln, r in zip(family.links, transfer_gbps(family), strict=True) if ln.kind.value == "pcie"})
    assert data["links"]["pcie"]["bw_gbps"] == reached
    assert data["links"]["pcie"]["rated_gbps"] == sorted({ln.bw_gbps for ln in family.links if ln.kind.value == "pcie"})
    text = run_cli("topo", "show", str(mine)).stdout
    row = next(ln for ln in text.splitlines() if ln.startswith("│ nvlink"))
    assert [c.strip() for c in row.strip("│").split("│")][2:] == ["474.378", "0.3", "450", "0.3"]
    assert NOTE in text
    family = run_cli("topo", "show", "dgx-h100")
    assert "rated" not in family.stdout and "link rates" not in family.stdout
    assert "rated_gbps" not in json.loads(run_cli("topo", "show", "dgx-h100", "--json").stdout)["links"]["nvlink"]


def test_every_command_says_which_rates_it_reads(mine, tmp_path):
    plan = tmp_path / "plan.yaml"
    runs = {
        "plan": ("plan", "-t", str(mine), "-m", "llama-3.1-8b", "-n", "16K", "-o", str(plan), "--no-progress"),
        "simulate": ("simulate", str(plan)),
        "compare": ("compare", "-t", str(mine), "-m", "llama-3.1-8b", "--seq-lens", "16K", "--no-progress"),
        "nccl-model": ("nccl-model", "-t", str(mine), "-c", "allreduce", "--bytes", "1MiB"),
        "check-model": ("check-model", str(LOG), "-t", str(mine), "--no-progress"),
    }
    for name, args in runs.items():
        res = run_cli(*args)
        assert res.exit_code == 0, (name, res.stderr)
        assert NOTE in res.stdout, name
        assert "point-to-point at the rates calibration measured (else NCCL's)" in res.stdout, name
    for name, args in runs.items():  # on the family's datasheet rates there is nothing to say
        if name == "simulate":
            continue
        res = run_cli(*[("dgx-h100" if a == str(mine) else a) for a in args])
        assert res.exit_code == 0 and "link rates" not in res.stdout, (name, res.stderr)


def test_a_measured_topology_without_ratings_says_nccl_reads_the_measured_rates(mine, tmp_path):
    bare = tmp_path / "bare.yaml"
    lines = mine.read_text().splitlines()
    bare.write_text("\n".join(re.sub(r", rated_(gbps|latency_us): [0-9.]+", "", ln) for ln in lines) + "\n")
    assert "rated_gbps" not in bare.read_text()
    res = run_cli("nccl-model", "-t", str(bare), "-c", "allreduce", "--bytes", "1MiB")
    assert res.exit_code == 0 and "NCCL's collectives read the measured rates too" in res.stdout


@pytest.mark.parametrize(("field", "value", "says"), [
    ("rated_gbps", "0", "must be > 0"), ("rated_gbps", "-1", "must be > 0"),
    ("rated_gbps", "fast", "valid number"), ("rated_gbps", ".inf", "finite number"),
    ("rated_latency_us", "-1", "must be >= 0"), ("rated_latency_us", ".nan", "finite number"),
])
def test_a_bad_rating_is_one_line_naming_the_field_and_line(mine, tmp_path, field, value, says):
    lines = mine.read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if "rated_gbps: 450.0" in ln)
    # The log measures NVLink's rate only (its sizes start past the latency's reach), so the
    # calibrated file keeps no rated latency: a bad one is written in beside the rating.
    new = f"{field}: {value}" if field == "rated_gbps" else f"rated_gbps: 450.0, {field}: {value}"
    lines[at] = lines[at].replace("rated_gbps: 450.0", new, 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text("\n".join(lines) + "\n")
    for args in (("topo", "show", str(bad)), ("nccl-model", "-t", str(bad), "-c", "allreduce", "--bytes", "1MiB"),
                 ("plan", "-t", str(bad), "--bytes", "1MiB", "-o", str(tmp_path / "p.yaml"))):
        res = run_cli(*args)
        assert res.exit_code == 2 and res.stdout == "", args
        assert res.stderr.count("\n") == 1 and f"bad.yaml:{at + 1}:" in res.stderr, res.stderr
        assert f".{field}: " in res.stderr and says in res.stderr, res.stderr


def test_a_rating_beside_a_datasheet_figure_is_refused(tmp_path):
    from treeattn.topology.io import dump_topology
    from treeattn.topology.library import resolve

    text = dump_topology(resolve("dgx-h100"))
    hand = tmp_path / "hand.yaml"
    nvlink = "bw_gbps: 450.0, latency_us: 0.3,"
    hand.write_text(text.replace(nvlink, "bw_gbps: 300.0, latency_us: 0.3, rated_gbps: 450.0,"))
    assert "rated_gbps: 450.0" in hand.read_text() and "link_rates" not in hand.read_text()
    res = run_cli("nccl-model", "-t", str(hand), "-c", "allreduce", "--bytes", "1MiB")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "hand.yaml:" in res.stderr and ".rated_gbps: a rating" in res.stderr
    assert "not measured (cost.link_rates)" in res.stderr
    measured = hand.read_text().replace("cost: {", "cost: {link_rates: measured, ", 1)
    hand.write_text(measured)
    res = run_cli("nccl-model", "-t", str(hand), "-c", "allreduce", "--bytes", "1MiB")
    assert res.exit_code == 0 and NOTE in res.stdout, res.stderr


def test_the_json_of_plan_and_compare_carries_the_rates_note_the_text_prints(mine, tmp_path):
    plan = json.loads(run_cli("plan", "-t", str(mine), "-m", "llama-3.1-8b", "-n", "16K", "-o",
                              str(tmp_path / "p.yaml"), "--no-progress", "--json").stdout)
    assert NOTE in plan["topology"]["link_rates_note"]
    compare = json.loads(run_cli("compare", "-t", str(mine), "-m", "llama-3.1-8b", "--seq-lens", "16K",
                                 "--no-progress", "--json").stdout)
    assert [NOTE in note for note in compare["link_rates_notes"].values()] == [True]
    family = json.loads(run_cli("plan", "-t", "dgx-h100", "-m", "llama-3.1-8b", "-n", "16K", "-o",
                                str(tmp_path / "f.yaml"), "--no-progress", "--json").stdout)
    assert family["topology"]["link_rates_note"] is None
