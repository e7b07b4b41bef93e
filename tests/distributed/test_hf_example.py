"""``examples/hf_llama_sharded_decode.py``: a Hugging Face Llama decoded with its KV cache split
over 2, 3 and 4 gloo ranks gives exactly the tokens of Hugging Face's own ``generate``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.untimed  # checks results only: scripts/test.sh runs it beside timed tests

pytest.importorskip("transformers", reason="the example needs the hf extra: pip install -e .[hf]")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_llama_sharded_decode.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLE), "--prompt-len", "96", "--new-tokens", "6", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [
    ("--ranks", "2"),
    ("--ranks", "3", "--method", "allgather-merge"),
    ("--ranks", "4", "--method", "allreduce3"),
    ("--ranks", "4", "--result", "heads", "--batch", "2"),
    ("--ranks", "3", "--method", "dcp-a2a", "--result", "heads"),
    # seed 2's prompt holds token 0, the pad id: the reference must not mask it out
    ("--ranks", "2", "--seed", "2"),
])
def test_sharded_decode_matches_hugging_face(args):
    res = run(*args)
    assert res.returncode == 0, res.stdout + res.stderr
    line = res.stdout.strip().splitlines()[-1]
    assert "6/6 tokens identical" in line or "12/12 tokens identical" in line, line
    assert line.endswith("yes)")


def test_a_plan_that_moves_kv_is_refused_before_starting():
    res = run("--ranks", "2", "--method", "ring-attention")
    assert res.returncode == 2 and "moves KV, not partials" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_help_lists_only_methods_the_example_can_run():
    res = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    listed = " ".join(res.stdout.split()).split("an algorithm: ")[1].split(" --result")[0]
    names = [n.strip() for n in listed.split(",")]
    assert {"star", "direct", "allgather-merge", "dcp-a2a"} <= set(names)
    assert not {"tree", "hierarchical", "ring-attention"} & set(names), names


@pytest.mark.parametrize(("args", "needle"), [(("--batch", "0"), "--batch must be >= 1, got 0"),
                                              (("--new-tokens", "0"), "--new-tokens must be >= 1, got 0")])
def test_bad_flags_are_named_in_one_line(args, needle):
    res = run(*args)
    assert res.returncode == 2 and res.stderr == f"error: {needle}\n", res.stderr
