"""Tables never lose a character, whatever the width: every command prints through
``treeattn.cli.render.console``."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.table import Table

from tests.cli_helpers import run_cli
from treeattn.cli.render import console, key_columns

_WORD = st.text("0123456789.,x/KiBMus-", min_size=1, max_size=12)
_CELL = st.lists(_WORD, min_size=1, max_size=3).map(" ".join)


def _render(table: Table, width: int) -> str:
    con = console()
    con.file = io.StringIO()
    con.width = width
    con.print(table)
    return con.file.getvalue()


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 14), st.integers(1, 5), st.integers(24, 160), st.integers(1, 3), st.data())
def test_no_cell_is_cut_at_any_width(ncols: int, nrows: int, width: int, keys: int, data: st.DataObject) -> None:
    table = key_columns(Table(title="t"), keys)
    for i in range(ncols):
        table.add_column(data.draw(_CELL, label=f"header {i}"), justify="right" if i % 2 else "left")
    rows = [[data.draw(_CELL) for _ in range(ncols)] for _ in range(nrows)]
    for row in rows:
        table.add_row(*row)
    text = _render(table, width)
    assert "…" not in text
    assert all(len(line) <= width for line in text.splitlines())
    lines = text.splitlines()
    for row in rows:
        for i, cell in enumerate(row):
            for word in cell.split():
                # A longer word cannot fit beside borders and padding: it folds; so may a key
                # column's long word, which every part repeats (fit_table).
                if len(word) <= (width - 4 if i >= min(keys, ncols - 1) else max(16, width // 4)):
                    assert any(word in line for line in lines), (word, text)


def test_a_key_columns_long_word_folds_so_that_every_part_names_its_row(monkeypatch, tmp_path) -> None:
    # a log's file name longer than the room beside the widest other column was a part of its
    # own, the fitted figures in another part naming no log
    monkeypatch.setenv("COLUMNS", "80")
    fixtures = Path(__file__).parents[1] / "fixtures" / "nccl-tests"
    log = tmp_path / "all_reduce_perf.cluster-a-rack-12-node-005-h100-sxm5-nccl-2.21.5-run3.txt"
    log.write_text((fixtures / "all_reduce_perf.8xh100-1node.txt").read_text())
    res = run_cli("calibrate", "--from-nccl-tests", str(log), "-t", "dgx-h100")
    assert res.exit_code == 0, res.stderr
    parts = res.stdout.split("nccl-tests fits mapped onto")[1:]
    assert len(parts) == 2 and all(len(line) <= 80 for line in res.stdout.splitlines())
    for part in parts:
        cells = "".join(line.split("│")[1].strip() for line in part.splitlines() if line.startswith("│"))
        assert log.name in cells, part
    assert "all_reduce" in parts[0] and "474.4" in parts[0] and "nvlink" in parts[1]


def _numbers(data: object) -> set[str]:
    if isinstance(data, dict):
        return set().union(*(map(_numbers, data.values()))) if data else set()
    if isinstance(data, list):
        return set().union(*(map(_numbers, data))) if data else set()
    if isinstance(data, int) and not isinstance(data, bool):
        return {str(data)}
    return set()


@pytest.mark.parametrize("args", [
    ("topo", "show", "dgx-h100"),
    ("topo", "show", "dgx-h100-2node"),
    ("topo", "show", "dgx-h100-16node"),
    ("topo", "list"),
    ("nccl-model", "-t", "dgx-h100-2node", "-c", "allreduce", "--bytes", "1MiB"),
    ("compare", "-t", "dgx-h100", "--nodes", "1,2", "--seq-lens", "128K", "-m", "llama-3.1-8b"),
])
def test_commands_keep_every_digit_at_80_columns(monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    res = run_cli(*args)
    assert res.exit_code == 0, res.stderr
    assert "…" not in res.stdout and "..." not in res.stdout
    # table lines: boxed, or (compare's narrow tables) indented by the simple box's padding
    assert max(len(line) for line in res.stdout.splitlines() if line[:1] in "┏┃┡│└ ") <= 80


def test_compare_table_holds_every_figure_of_its_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    args = ("compare", "-t", "dgx-h100", "--nodes", "1,2", "--seq-lens", "128K", "-m", "llama-3.1-8b")
    text = run_cli(*args).stdout
    rows = json.loads(run_cli(*args, "--json").stdout)["rows"]
    cells = set(re.findall(r"[0-9][0-9.,]*", text))
    for r in rows:
        assert f"{r['predicted_us']:.1f}" in cells, (r, text)
        assert str(r["ranks"]) in cells


def test_every_command_prints_through_the_one_console() -> None:
    cli = Path(__file__).resolve().parents[2] / "treeattn" / "cli"
    own = [p.name for p in sorted(cli.glob("*.py"))
           if p.name not in ("render.py", "__init__.py") and "Console(" in p.read_text()]
    assert not own, f"{own} make their own rich Console: print through treeattn.cli.render.console()"


@pytest.mark.parametrize("width", [24, 37, 38, 61, 62, 80])
def test_a_no_wrap_column_keeps_its_header_whole(width: int) -> None:
    # Split into parts if need be, but "× plan" never becomes "×" over "plan".
    table = key_columns(Table(title="t"), 1)
    for name in ("method", "measured", "predicted", "error"):
        table.add_column(name)
    table.add_column("× plan", no_wrap=True)
    table.add_row("allgather-merge", "1,234,567", "2,679", "+123450%", "1.00")
    text = _render(table, width)
    assert "× plan" in text and all(len(line) <= width for line in text.splitlines()), text


def test_run_table_keeps_its_ratio_header_whole(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    # `treeattn run p.yaml --baselines -t mi300x-4 | cat` (a cpu-4 plan predicted on a GPU
    # machine): errors of +35804% leave the ratio header little room; it must stay whole, not
    # wrap into "×" above "plan".
    import pandas as pd

    from treeattn.cli.run import _table

    monkeypatch.setenv("COLUMNS", "80")
    rows = [{"plan": "p.yaml", "algorithm": "allreduce", "workload": "raw 1048576B fp32 sum", "ranks": 4,
             "backend": "gloo", "topology": "mi300x-4", "method": method, "measured_median_us": us,
             "spread_us": 15_004.0, "predicted_us": 34.0, "rel_error": us / 34.0 - 1, "correct": True,
             "max_rel_err": 0.0, "same_bits": True} for method, us in (("plan", 12_224.0), ("allreduce", 12_576.0),
                                                     ("allgather-merge", 13_071.0))]
    _table(pd.DataFrame(rows), Path("runs/c.csv"), False)
    lines = capsys.readouterr().out.splitlines()
    header = [line for line in lines if line.startswith("┃")]
    assert any("× plan" in line for line in header), "\n".join(lines)
    assert all(len(line) <= 80 for line in lines if line[:1] in "┏┃┡│└")


def test_plan_table_keeps_its_ratio_headers_whole(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    res = run_cli("plan", "-t", "dgx-h100-2node", "-m", "llama-3.1-8b", "-b", "1", "-n", "128K",
                  "-o", str(tmp_path / "p.yaml"), "--no-progress")
    assert res.exit_code == 0, res.stderr
    header = [line for line in res.stdout.splitlines() if line.startswith("┃")]
    assert any("x bound" in line for line in header) and any("x 3 all-reduces" in line for line in header), res.stdout


@pytest.mark.parametrize("tag", ["[red]", "[/x]"])
def test_names_and_paths_print_as_given_not_as_markup(tmp_path, tag):
    # rich reads "[red]" as a style (dropped without a word) and "[/x]" as a closing tag
    # (a MarkupError traceback): a topology's name, a path and a description are not markup.
    topo = tmp_path / "box.yaml"
    topo.write_text(f'name: "box{tag}"\ndescription: "lab box {tag} [bold]"\n'
                    "node:\n  gpus: {count: 2, mem_bw_gbps: 864, mem_gb: 48}\n  pcie: {bw_gbps: 25}\n")
    plan, csv = (tmp_path / f"{stem}{tag.replace('/', '')}.{ext}" for stem, ext in (("p", "yaml"), ("c", "csv")))
    runs = {
        "plan": (("plan", "-t", str(topo), "-m", "llama-3.1-8b", "-n", "128K", "-o", str(plan)),
                 (f"box{tag} (2 ranks)", f"wrote {plan}")),
        "simulate": (("simulate", str(plan)), (f"on box{tag}",)),
        "nccl-model": (("nccl-model", "-t", str(topo), "-c", "allreduce", "--bytes", "1MiB"), (f"on box{tag}:",)),
        "topo show": (("topo", "show", str(topo)), (f"box{tag}  2 ranks", f"lab box {tag} [bold]")),
        "compare": (("compare", "-t", str(topo), "-m", "llama-3.1-8b", "--seq-lens", "128K", "--csv", str(csv)),
                    (f"2 ranks: box{tag}", f"wrote {csv}")),
    }
    for name, (args, wanted) in runs.items():
        res = run_cli(*args)
        assert res.exit_code == 0, (name, res.stderr)
        for text in wanted:
            assert text in res.stdout, (name, text, res.stdout)


def test_a_run_without_predictions_does_not_say_what_predicted_it(capsys) -> None:
    # A plan whose topology is found nowhere runs unpredicted (a warning says so); the table's
    # first line must not claim "predicted on NAME (uncalibrated)" over empty predictions.
    import pandas as pd

    from treeattn.cli.run import _table

    rows = [{"plan": "p.yaml", "algorithm": "star", "workload": "raw 4096B fp32 sum", "ranks": 2,
             "backend": "gloo", "topology": "my-lab", "method": "plan", "measured_median_us": 90.0,
             "spread_us": 4.0, "predicted_us": float("nan"), "rel_error": float("nan"), "correct": True,
             "max_rel_err": 0.0, "same_bits": True}]
    _table(pd.DataFrame(rows), Path("runs/c.csv"), False)
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("raw 4096B fp32 sum; not predicted (my-lab not found, or changed since the plan: pass "
                     "--topology)"), first
    rows[0].update(predicted_us=80.0, rel_error=0.125)
    _table(pd.DataFrame(rows), Path("runs/c.csv"), True)
    assert capsys.readouterr().out.splitlines()[0] == "raw 4096B fp32 sum; predicted on my-lab"


def test_a_plan_of_a_baselines_method_says_its_two_rows_are_one_method(capsys) -> None:
    # README's `plan -t cpu:ranks=2` picks allgather-merge, which --baselines runs again: the
    # trial read "x plan 0.85" on that row as another method beating the plan.
    import pandas as pd

    from treeattn.cli.run import _table

    def rows(algorithm: str) -> list[dict]:
        return [{"plan": "p.yaml", "algorithm": algorithm, "workload": "w", "ranks": 2, "backend": "gloo",
                 "topology": "cpu-2", "method": method, "measured_median_us": us, "spread_us": 4.0,
                 "predicted_us": 80.0, "rel_error": us / 80 - 1, "correct": True, "max_rel_err": 0.0,
                 "same_bits": True} for method, us in (("plan", 90.0), ("allgather-merge", 77.0))]

    _table(pd.DataFrame(rows("allgather-merge")), Path("runs/c.csv"), False)
    out = " ".join(capsys.readouterr().out.split())
    assert "the plan is allgather-merge: its baseline row runs the same method" in out
    _table(pd.DataFrame(rows("star")), Path("runs/c.csv"), False)
    assert "the plan is" not in capsys.readouterr().out
