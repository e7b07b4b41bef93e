"""Commands that run torch ranks read every argument first: a bad one is said at once, not
after torch's import (seconds on a small machine)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]

CASES = [
    ["calibrate", "-t", "nosuch"],
    ["calibrate", "-t", "cpu-4", "--round-trips", "1,x"],
    ["calibrate", "-t", "cpu-4", "--attention-shape", "32/8"],
    ["calibrate", "-t", "cpu-4", "--min-size", "4X"],
    ["run", "no-such-plan.yaml"],
]

CODE = f"""
import sys
from treeattn.cli import main
for args in {CASES!r}:
    try:
        main(args)
    except SystemExit as exc:
        assert exc.code == 2, (args, exc.code)
    else:
        raise AssertionError(f"{{args}} was not refused")
    assert "torch" not in sys.modules, f"{{args}} imported torch before refusing"
"""


def test_bad_arguments_are_refused_before_torch_is_imported(tmp_path):
    # the checkout's treeattn (this test's), whatever the interpreter has installed; run elsewhere,
    # so that a relative path names nothing
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("error: ") == len(CASES), proc.stderr
