"""A reader that leaves early (``treeattn plan ... | head -1``) neither stops nor fails a
command: it does all its work, writes its files, and ends with its own status, with nothing
on stderr about the pipe. Real processes and real pipes: the behaviour is the interpreter's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from treeattn.plan.builders import build
from treeattn.plan.io import save_plan
from treeattn.topology.library import resolve
from treeattn.workload import Workload

TREEATTN = str(Path(sys.executable).with_name("treeattn"))
ROOT = Path(__file__).parents[2]
PLAN = str(ROOT / "plans" / "dgx-h100-2node.llama-3.1-8b.b1.yaml")
W = Workload(batch=1, q_heads=4, kv_heads=2, head_dim=8, split=(4, 4), kv_dtype="fp32")
PLAN_ARGS = ("plan", "-t", "dgx-h100-2node", "-m", "llama-3.1-8b", "-n", "128K", "--no-progress")

COMMANDS = {
    "plan": PLAN_ARGS,
    "plan-list": ("plan", "-a", "list"),
    "topo-show": ("topo", "show", "dgx-h100-2node"),
    "compare": ("compare", "-t", "cpu-4", "-m", "llama-3.1-8b", "--seq-lens", "1K"),
    "simulate": ("simulate", PLAN),
    "verify": ("verify", PLAN),
    "nccl-model": ("nccl-model", "-t", "dgx-h100-2node", "-c", "allreduce", "--bytes", "1MiB"),
    "nccl-model-json": ("nccl-model", "-t", "dgx-h100-2node", "-c", "allreduce", "--bytes", "1MiB", "--json"),
    # on a copy: report writes the folder's README.md
    "report": ("report", "validate-emu", "--no-plots"),
}


def _closed_early(args: list[str], cwd: Path, first_line: bool) -> tuple[int, str]:
    """Run ``treeattn ARGS`` with its stdout on a pipe whose read end is closed at once, or
    after the first line (as ``head -1``); its exit status and stderr."""
    proc = subprocess.Popen([TREEATTN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)
    if first_line:
        assert proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=300), err


def _assert_quiet(err: str) -> None:
    for word in ("Traceback", "Exception ignored", "Broken pipe", "BrokenPipeError", "error:"):
        assert word not in err, err


@pytest.mark.parametrize("name", COMMANDS)
def test_a_closed_stdout_neither_stops_nor_fails_a_command(tmp_path: Path, name: str) -> None:
    # Closed before the first line: every line the command prints meets the closed pipe.
    if name == "report":
        shutil.copytree(ROOT / "results" / "validate-emu", tmp_path / "validate-emu")
    rc, err = _closed_early(list(COMMANDS[name]), tmp_path, first_line=False)
    assert rc == 0, err
    _assert_quiet(err)


def test_plan_piped_into_head_writes_its_whole_plan_file(tmp_path: Path) -> None:
    whole = tmp_path / "whole.yaml"
    subprocess.run([TREEATTN, *PLAN_ARGS, "-o", str(whole)], stdout=subprocess.DEVNULL, check=True, cwd=tmp_path)
    for first_line in (True, False):
        piped = tmp_path / f"piped-{first_line}.yaml"
        rc, err = _closed_early([*PLAN_ARGS, "-o", str(piped)], tmp_path, first_line)
        assert rc == 0, err
        _assert_quiet(err)
        assert piped.read_bytes() == whole.read_bytes()


def test_run_piped_into_head_writes_its_rows(tmp_path: Path) -> None:
    plan = save_plan(build("star", W, resolve("cpu:ranks=2,cores=2")), tmp_path / "p.yaml")
    for first_line in (True, False):
        rows = tmp_path / f"rows-{first_line}.csv"
        rc, err = _closed_early(["run", str(plan), "--repeats", "2", "--warmup", "0", "--out", str(rows)], tmp_path,
                                first_line)
        assert rc == 0, err
        _assert_quiet(err)
        assert pd.read_csv(rows)["method"].tolist() == ["plan"]
        assert len(pd.read_csv(rows.with_name(rows.stem + ".timeline.csv"))) > 0

