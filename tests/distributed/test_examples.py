"""The Python examples run as the README shows them (`python examples/NAME.py`): 4 gloo ranks
each, every rank's merged attention matching one process over the whole cache."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.untimed  # checks results only: scripts/test.sh runs it beside timed tests

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("name", "pattern"), [
    ("python_api.py", r"rank (\d): \S+, max \|error\| (\S+)"),
    # DeepSeek's absorbed MLA over a split latent cache against its per-head attention
    ("deepseek_mla_decode.py", r"rank (\d): \S+, partial 512 \+ 1 values a head, max relative error (\S+)"),
])
def test_an_example_runs_and_every_rank_is_exact(name, pattern):
    res = subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    found = {int(r): float(e) for r, e in re.findall(pattern, res.stdout)}
    assert sorted(found) == [0, 1, 2, 3], res.stdout
    assert max(found.values()) < 1e-5, res.stdout
