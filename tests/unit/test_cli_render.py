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
        for cell in row:
            for word in cell.split():
                if len(word) <= width - 4:  # a longer word cannot fit beside borders and padding: it folds
                    assert any(word in line for line in lines), (word, text)


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
