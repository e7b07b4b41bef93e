"""Scripts in benchmarks/ refuse bad input as the CLI does: one line on stderr, exit 2, no
traceback (``treeattn.cli.script``)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from treeattn.cli.script import ArgumentParser, count, count_list, run, size_list
from treeattn.errors import ExecutionError, InputError

ROOT = Path(__file__).resolve().parents[2]

# A bad value per script, refused before any work.
BAD = {
    "bench_api.py": ["--calls", "0"],
    "bench_calibrate.py": ["--sizes", "16KB,lots"],
    "bench_calibrate_half_split.py": ["--out", "/proc/none/table.txt"],
    "bench_compare.py": ["--out", "/proc/none"],
    "bench_merge_kernel.py": ["--k", "1,0"],
    "bench_plan.py": ["--ranks", "-1"],
    "bench_run.py": ["--batches", "1,x"],
    "bench_scale.py": ["--ranks", "8,9"],
    "bench_search.py": ["--part", "quality", "--seq-lens", "lots"],
    "bench_simulate.py": ["--nodes", "0"],
    "gpu_check.py": ["--out", "/tmp/x", "--repeats", "0"],
    "refit_host.py": ["/proc/none"],
    "topology_scale.py": ["nosuch:nodes=2"],
}


def test_every_script_has_a_bad_case() -> None:
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert scripts == set(BAD)


@pytest.mark.parametrize("script", sorted(BAD))
def test_a_script_refuses_bad_input_in_one_line(script: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *BAD[script]], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"{script}: error: ") and "Traceback" not in proc.stderr


def test_parser_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    ap = ArgumentParser(prog="x.py")
    ap.add_argument("--n", type=count)
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(["--n", "zero"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "x.py: error: argument --n: 'zero' is not a whole number (see --help)\n"


def test_counts_and_lists() -> None:
    assert count("3") == 3 and count("0", 0) == 0 and count_list("1, 16,128") == [1, 16, 128]
    assert size_list("16KB,1MiB") == [16_000, 1 << 20]
    for fn, text in ((count, "0"), (count, "1.5"), (count_list, "1,,2"), (count_list, "1,-2"), (size_list, "0"),
                     (size_list, "1MB,lots")):
        with pytest.raises(argparse.ArgumentTypeError):
            fn(text)


def test_run_renders_library_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["benchmarks/x.py"])

    def bad() -> None:
        raise InputError("--ranks 3: no\n  such case")

    def failed() -> None:
        raise ExecutionError("rank 1 died")

    assert run(bad) == 2 and capsys.readouterr().err == "x.py: error: --ranks 3: no such case\n"
    assert run(failed) == 1 and capsys.readouterr().err == "x.py: error: rank 1 died\n"
    assert run(lambda: None) == 0 and run(lambda: 3) == 3


def test_bench_plan_checks_its_algorithms_before_printing() -> None:
    # A header on stdout followed by an error would read as the start of a result table.
    script = ROOT / "benchmarks" / "bench_plan.py"
    proc = subprocess.run([sys.executable, str(script), "--algorithms", "binomial,bogus"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("bench_plan.py: error: --algorithms: unknown algorithm 'bogus'")
