"""A plan made from a topology file can be simulated again from anywhere, and a missing or
changed topology is named with what to pass (never another topology in silence)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.plan.io import load_plan
from treeattn.topology.library import resolve, shipped_files

SHAPE = ("-m", "llama-3.1-8b", "-n", "16K", "--no-progress")


@pytest.fixture()
def made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The quickstart's layout: topologies/local/cpu-4.yaml (name inside: cpu-calibrated) and a plan
    under plans/local/."""
    (tmp_path / "topologies" / "local").mkdir(parents=True)
    text = shipped_files()["cpu-4"].read_text().replace("name: cpu-4", "name: cpu-calibrated")
    (tmp_path / "topologies" / "local" / "cpu-4.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    res = run_cli("plan", "-t", "topologies/local/cpu-4.yaml", *SHAPE, "-o", "plans/local/cpu-4.yaml")
    assert res.exit_code == 0, res.stderr
    return tmp_path / "plans" / "local" / "cpu-4.yaml"


def test_plan_records_the_file_relative_to_itself(made: Path) -> None:
    ref = load_plan(made).topology
    assert ref.name == "cpu-calibrated" and ref.source == "../../topologies/local/cpu-4.yaml"


def test_simulate_finds_it_from_another_folder(made: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(made.parents[2].parent)
    res = run_cli("simulate", str(made))
    assert res.exit_code == 0, res.stderr
    assert "on cpu-calibrated" in res.stdout and res.stderr == ""


def test_missing_or_changed_file_says_what_to_pass(made: Path) -> None:
    topo_file = made.parents[2] / "topologies" / "local" / "cpu-4.yaml"
    moved = topo_file.with_name("moved.yaml")
    shutil.move(topo_file, moved)
    res = run_cli("simulate", str(made))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "cpu-4.yaml, which does not exist" in res.stderr and "pass --topology" in res.stderr
    res = run_cli("simulate", str(made), "-t", str(moved))
    assert res.exit_code == 0 and res.stderr == ""  # the same topology, found where the user says
    changed = re.sub(r"overhead_us: [0-9.]+", "overhead_us: 99.5", moved.read_text())
    assert changed != moved.read_text()
    topo_file.write_text(changed)
    res = run_cli("simulate", str(made))
    assert res.exit_code == 2 and "changed since" in res.stderr and "pass --topology" in res.stderr
    res = run_cli("simulate", str(made), "-t", str(topo_file))
    assert res.exit_code == 0 and "warning: plan was made for cpu-calibrated" in res.stderr


def test_a_file_that_now_places_another_rank_count_says_so(made: Path) -> None:
    topo_file = made.parents[2] / "topologies" / "local" / "cpu-4.yaml"
    text = topo_file.read_text()
    assert 'ranks: ["host0*4"]' in text
    topo_file.write_text(text.replace('ranks: ["host0*4"]', 'ranks: ["host0*2"]'))
    res = run_cli("simulate", str(made))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "places 2 ranks now, not the plan's 4" in res.stderr and "changed since" not in res.stderr


def test_shipped_names_and_families_record_no_file(tmp_path: Path) -> None:
    for spec, ranks in (("dgx-h100-2node", None), ("cpu:ranks=3", None), ("dgx-h100-2node", "0-3")):
        args = ("-t", spec, *(("--ranks", ranks) if ranks else ()))
        out = tmp_path / f"{spec}-{ranks}.yaml"
        assert run_cli("plan", *args, *SHAPE, "-o", str(out)).exit_code == 0
        ref = load_plan(out).topology
        assert ref.source is None and resolve(ref.name).fingerprint == ref.fingerprint
        assert run_cli("simulate", str(out)).exit_code == 0


def test_a_selection_of_a_file_is_recorded_with_it(made: Path) -> None:
    root = made.parents[2]
    out = root / "plans" / "sub.yaml"
    res = run_cli("plan", "-t", "topologies/local/cpu-4.yaml", "--ranks", "0-2", *SHAPE, "-o", str(out))
    assert res.exit_code == 0, res.stderr
    assert load_plan(out).topology.source == "../topologies/local/cpu-4.yaml[ranks 0-2]"
    assert run_cli("simulate", str(out)).exit_code == 0


def test_a_topology_file_without_suffix_or_through_a_symlinked_folder_is_found(tmp_path, monkeypatch):
    import dataclasses
    import os

    from treeattn.topology.io import dump_topology
    from treeattn.topology.library import recorded_source, resolve, resolve_recorded

    topo = dataclasses.replace(resolve("cpu:ranks=2"), name="mine")
    (tmp_path / "mytopo").write_text(dump_topology(topo))
    # Beside the plan, a bare name would read back as a topology name, not a file.
    source = recorded_source(str(tmp_path / "mytopo"), topo, tmp_path / "p.yaml")
    assert source == "./mytopo"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert resolve_recorded("mine", topo.fingerprint, source, tmp_path / "p.yaml").fingerprint == topo.fingerprint
    # A plan written through a symlinked folder records the path from its real folder.
    (tmp_path / "real" / "a" / "b").mkdir(parents=True)
    os.symlink(tmp_path / "real" / "a" / "b", tmp_path / "link")
    linked = recorded_source(str(tmp_path / "mytopo"), topo, tmp_path / "link" / "p.yaml")
    assert linked == "../../../mytopo"
    assert resolve_recorded("mine", topo.fingerprint, linked, tmp_path / "link" / "p.yaml").name == "mine"


def test_a_topology_read_from_a_pipe_is_recorded_by_name_not_by_its_path(tmp_path):
    """``plan -t <(cat my.yaml)``: the pipe is gone once read, and its path names
    /proc/PID/fd/pipe:[N]; the plan keeps the name and fingerprint, --topology finds it again."""
    import os

    from treeattn.topology.library import recorded_source, resolve

    topo = resolve("emu-2x4")
    fifo = tmp_path / "topo.yaml"
    os.mkfifo(fifo)
    assert recorded_source(str(fifo), topo, tmp_path / "p.yaml") is None
    regular = tmp_path / "mine.yaml"
    regular.write_text("x")
    assert recorded_source(str(regular), topo, tmp_path / "p.yaml") == "mine.yaml"


def test_a_source_that_is_a_folder_is_named_one(made: Path) -> None:
    topo_file = made.parents[2] / "topologies" / "local" / "cpu-4.yaml"
    topo_file.unlink()
    topo_file.mkdir()  # the name the plan records is now a folder
    res = run_cli("simulate", str(made))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "cpu-4.yaml, a folder, not a topology file" in res.stderr


def test_a_topologies_folder_set_to_no_folder_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # shipped names went unfound ("none found") with nothing naming the variable that hid them
    two = shipped_files()["dgx-h100-2node"]
    monkeypatch.setenv("TREEATTN_TOPOLOGIES", str(tmp_path / "gone"))
    for args in (("topo", "list"), ("topo", "show", "dgx-h100-2node")):
        res = run_cli(*args)
        assert res.exit_code == 2 and res.stderr.strip() == (
            f"error: $TREEATTN_TOPOLOGIES is '{tmp_path / 'gone'}', which is not a folder: it names the folder of "
            "shipped topology files in place of treeattn's own; unset it or name a folder"), res.stderr
    (tmp_path / "mine").mkdir()
    shutil.copy(two, tmp_path / "mine" / "two.yaml")
    monkeypatch.setenv("TREEATTN_TOPOLOGIES", str(tmp_path / "mine"))
    assert resolve("two").num_ranks == 16
