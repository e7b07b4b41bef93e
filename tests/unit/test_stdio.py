"""``treeattn.stdio``: a command started with a standard stream closed, an encoding that cannot
write the tables, or ``COLUMNS=0`` (a new-user trial: tracebacks with status 120, a plan "written"
to a closed stdout, ``verify /dev/stdin`` waiting forever, every error line dropped)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAN = "plan -t cpu:ranks=2 -n 1K -m llama-3.2-1b"
BAD = "plan -t cpu:ranks=2 -n 0 -m llama-3.2-1b"


def treeattn(args: str, redirect: str = "", env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    command = f"{shlex.quote(sys.executable)} -m treeattn {args} {redirect}"
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_a_plan_to_a_closed_stdout_is_refused_not_written_into_the_next_file_opened(tmp_path):
    res = treeattn(f"{PLAN} -o -", ">&-", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines()[-1] == ("error: --out '/dev/stdout': standard output is closed (>&-); "
                                                   "give a file"), res.stderr
    assert list(tmp_path.iterdir()) == []


def test_closed_streams_give_the_commands_own_status_and_no_traceback(tmp_path):
    for redirect in (">&-", "2>&-", ">&- 2>&-"):
        res = treeattn(BAD, redirect, cwd=tmp_path)
        assert res.returncode == 2 and "Traceback" not in res.stderr, (redirect, res.stderr)
    res = treeattn(f"{PLAN} -o p.yaml", ">&-", cwd=tmp_path)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert (tmp_path / "p.yaml").read_text().startswith("# treeattn plan")
    res = treeattn("verify /dev/stdin", "<&-", cwd=tmp_path)  # waited on a pipe of its own
    assert res.returncode == 2 and res.stderr == "error: /dev/stdin: not a plan file: it is empty\n", res.stderr


def test_columns_zero_and_an_ascii_encoding(tmp_path):
    res = treeattn(BAD, env={"COLUMNS": "²"}, cwd=tmp_path)  # a digit to isdigit(), not to int()
    assert res.returncode == 2 and res.stderr == "error: --seq-len must be at least 1 token, got '0'\n", res.stderr
    res = treeattn(f"{PLAN} -o /dev/null", ">&-", cwd=tmp_path)  # fd 1 is the null device then: not refused
    assert res.returncode == 0, res.stderr
    res = treeattn(BAD, env={"COLUMNS": "0"}, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr == "error: --seq-len must be at least 1 token, got '0'\n", res.stderr
    res = treeattn(f"{PLAN} -o p.yaml", env={"COLUMNS": "0"}, cwd=tmp_path)
    assert res.returncode == 0 and "Candidates" in res.stdout, res.stderr
    res = treeattn(f"{PLAN} -o q.yaml", env={"PYTHONIOENCODING": "ascii"}, cwd=tmp_path)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "predicted \\xb5s" in res.stdout
