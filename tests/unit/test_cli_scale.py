"""Sizes above the documented limit are refused at once, and a long search shows progress
whether or not stderr is a terminal."""

from __future__ import annotations

import time

import pytest

from tests.cli_helpers import run_cli
from treeattn import cli
from treeattn.cli import progress as progress_cli
from treeattn.topology.model import MAX_RANKS

SHAPE = ("-m", "llama-3.1-8b", "-n", "16K")


@pytest.mark.parametrize("args", [
    ("topo", "show", "dgx-h100:nodes=100000"),
    ("plan", "-t", "dgx-h100:nodes=100000", *SHAPE),
    ("topo", "show", "cpu:ranks=100000"),
    ("compare", "-t", "dgx-h100", "--nodes", "1,4096", "-m", "llama-3.1-8b"),
    ("probe", "--from-nvidia-smi", "tests/fixtures/probe/nvidia-smi-topo-m.dgx-a100.txt", "--gpu-model",
     "A100-SXM4-80GB", "--nodes", "100000", "--nic-gbps", "200"),
])
def test_above_the_limit_is_one_line_at_once(args):
    started = time.perf_counter()
    res = run_cli(*args)
    assert time.perf_counter() - started < 10  # nothing built first (100000 nodes took 130 s and 8 GB)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert f"limit of {MAX_RANKS:,} ranks" in res.stderr and "README" in res.stderr


def test_the_limit_itself_is_accepted():
    assert run_cli("topo", "validate", f"cpu:ranks={MAX_RANKS}").exit_code == 0
    assert run_cli("topo", "validate", f"cpu:ranks={MAX_RANKS + 1}").exit_code == 2


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path, monkeypatch):
    monkeypatch.setattr(progress_cli, "PROGRESS_EVERY_S", 0.02)
    res = run_cli("plan", "-t", "dgx-h100-2node", *SHAPE, "-o", str(tmp_path / "p.yaml"))
    assert res.exit_code == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("planning: ")]
    assert lines and all(" steps, " in ln and "None" not in ln for ln in lines)
    assert any(ln.split(": ")[-1].split(" steps")[0] != "0/0" for ln in lines)  # a total, not 0/None
    quiet = run_cli("plan", "-t", "dgx-h100-2node", *SHAPE, "-o", str(tmp_path / "q.yaml"), "--no-progress")
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_progress_bar_on_a_terminal_shows_a_total(monkeypatch):
    import io

    monkeypatch.setattr(cli.err_console, "_force_terminal", True)
    monkeypatch.setattr(cli.err_console, "is_interactive", True)
    monkeypatch.setattr(cli.err_console, "file", io.StringIO())
    with progress_cli.progress_reporter(None, "planning") as update:
        time.sleep(0.3)  # the bar's first frame, before any step: "0/?" (it showed "0/None")
        update(3, 17, "screening")
        time.sleep(0.3)
    shown = cli.err_console.file.getvalue()
    assert "None" not in shown and "3/17" in shown


@pytest.mark.parametrize("args, needle", [
    (("compare", "-t", "dgx-h100-2node", "--nodes", "1,2"), "--nodes needs a family"),
    (("compare", "-t", "cpu:ranks=4", "--nodes", "2"), "--nodes: family cpu has no node count (its parameters: "),
    # gb200-nvl72 grows by racks: 'family gb200-nvl72 has no parameter nodes' named a setting not typed
    (("compare", "-t", "gb200-nvl72", "--nodes", "2"), "--nodes: family gb200-nvl72 has no node count (its "
     "parameters: racks, fabric, nics_per_leaf, spines, oversubscription); it grows by racks: --topology "
     "'gb200-nvl72:racks={2}'"),
    (("topo", "show", "dgx-h100:node=2"), "topology 'dgx-h100:node=2': family dgx-h100 has no parameter 'node'"),
    (("topo", "show", "dgx-h100:nodes=0"), "topology 'dgx-h100:nodes=0': nodes must be an integer >= 1"),
])
def test_family_and_node_count_mistakes_read_as_one_sentence(args, needle):
    res = run_cli(*args)
    assert res.exit_code == 2 and needle in " ".join(res.stderr.split()), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
