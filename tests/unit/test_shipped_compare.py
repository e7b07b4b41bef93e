"""results/compare still holds what the code computes: a few of its cases are regenerated as
benchmarks/bench_compare.py makes them and compared with the shipped files, so a change to
the planner or the cost model that moves a shipped figure fails here until the folder is
regenerated (the whole sweep takes about a minute; these cases a few seconds).

Exact where the output does not depend on the cases left out: the CSV lines, the lines of
bench_compare.txt's own tables and every line of the commands' output outside their tables.
The commands' tables are as wide as their widest cell over all cases, so their rows are
compared cell by cell. Not compared: the benchmark's last line, its wall time.
"""

from __future__ import annotations

import csv
import importlib.util
import re
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from treeattn.search.compare import METHODS

ROOT = Path(__file__).resolve().parents[2]
OUT = Path("results/compare")  # as the benchmark is told (--out), so as its files name it
STALE = ("results/compare is stale (the planner, cost model or compare's output changed): regenerate with "
         "`.venv/bin/python benchmarks/bench_compare.py --out results/compare > results/compare/bench_compare.txt`")

_spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "benchmarks" / "bench_compare.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

# One sequence length a command (flag values replaced, and how many cases that leaves): for
# Llama every node count (one node, two, and 128 ranks with their '-' cells and notes); at
# 128K, where the merge is a larger share of the step than at 1M.
SUBSETS = {"llama-3.1-8b": ({"--seq-lens": "128K"}, 3),
           "paper": ({"--seq-lens": "160K"}, 1)}
PAPER_N = 160 << 10
HEADS_CASE = ("dgx-h100-2node", 256)  # bandwidth-bound: where the heads plan moves half the bytes
RANKS_LINE = re.compile(r"\d+ ranks: ")


def _shipped(name: str) -> str:
    return (ROOT / OUT / name).read_text(encoding="utf-8")


def _subset(argv: list[str], values: dict[str, str]) -> list[str]:
    out = list(argv)
    for flag, value in values.items():
        out[out.index(flag) + 1] = value  # ValueError if the benchmark stopped passing the flag
    return out


def _parse(text: str) -> tuple[dict[tuple[str | None, str], list[str]], list[str]]:
    """The table rows of a compare output by (table title, 'ranks N'), and its other lines."""
    rows: dict[tuple[str | None, str], list[str]] = {}
    other: list[str] = []
    title = None
    for line in text.splitlines():
        cells = line.split()
        if not cells or set(line) <= {" ", "─"} or line.startswith(("$ treeattn ", "wrote ")):
            continue  # a table's padding and rule, as wide as the table; the command; the files written
        if line.startswith(" ") and (cells[0] == "ranks" or cells[0].isdigit()):
            rows[(title, " ".join(cells[:2]))] = cells
            continue
        other.append(line)
        if not line.startswith(" "):
            title = line
    return rows, other


def _csv_key(line: str) -> tuple[str, str]:
    row = next(csv.reader([line]))
    return row[0], row[2]  # topology, seq_len


@pytest.mark.parametrize("name", sorted(SUBSETS))
def test_a_compare_command_still_writes_its_shipped_rows(name, tmp_path, monkeypatch):
    argv = bench.COMMANDS[name]
    text = _shipped(f"{name}.txt")
    assert text.splitlines()[0] == f"$ treeattn {' '.join([*argv, '--csv', str(OUT / f'{name}.csv')])}", STALE
    values, cases = SUBSETS[name]
    monkeypatch.setenv("COLUMNS", "80")  # as the benchmark runs it: wider or narrower re-wraps the notes
    res = run_cli(*_subset(argv, values), "--csv", str(tmp_path / "got.csv"))
    assert res.exit_code == 0, res.stderr

    got = (tmp_path / "got.csv").read_text(encoding="utf-8").splitlines()
    want = _shipped(f"{name}.csv").splitlines()
    assert len(got) == 1 + cases * len(METHODS), got
    keys = {_csv_key(line) for line in got[1:]}
    assert got == want[:1] + [line for line in want[1:] if _csv_key(line) in keys], f"{name}.csv: {STALE}"

    got_rows, got_other = _parse(res.stdout)
    want_rows, want_other = _parse(text)
    assert len(got_rows) == 4 * (1 + cases), got_rows  # four tables: a header and a row a case each
    for key, cells in got_rows.items():
        assert want_rows.get(key) == cells, f"{name}.txt, {key}: {cells} vs {want_rows.get(key)}; {STALE}"
    # Only the rank counts the subset covers are listed above its tables.
    want_other = [line for line in want_other if not RANKS_LINE.match(line) or line in got_other]
    assert got_other == want_other, f"{name}.txt: {STALE}"


def _bench_tables() -> list[str]:
    """bench_compare.txt after the two commands' output, which it holds as their files do."""
    text = _shipped("bench_compare.txt")
    head = "".join(_shipped(f"{name}.txt") + "\n" for name in bench.COMMANDS)
    assert text.startswith(head), f"bench_compare.txt does not hold the commands' files as written; {STALE}"
    lines = text[len(head):].splitlines()
    assert re.fullmatch(r"\d+\.\d s", lines[-1]), lines[-1]  # the wall time: the one line not compared
    return lines[:-1]


def test_the_paper_table_still_holds():
    lines = _bench_tables()
    paper = lines[:2 + len(bench.PAPER_LENS)]
    got = bench.paper_table([PAPER_N])
    assert got == paper[:2] + [paper[2 + bench.PAPER_LENS.index(PAPER_N)]], f"bench_compare.txt: {STALE}"


def test_the_heads_table_still_holds():
    lines = _bench_tables()
    heads = lines[3 + len(bench.PAPER_LENS):]
    assert lines[2 + len(bench.PAPER_LENS)] == "" and len(heads) == 2 + len(bench.HEADS_CASES), lines
    got = bench.heads_table([HEADS_CASE])
    assert got == heads[:2] + [heads[2 + bench.HEADS_CASES.index(HEADS_CASE)]], f"bench_compare.txt: {STALE}"
