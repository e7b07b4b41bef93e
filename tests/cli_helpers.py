"""Run the real CLI entry point in-process and capture what a user would see."""

from __future__ import annotations

import contextlib
import io
import threading
from dataclasses import dataclass
from pathlib import Path

from treeattn.cli import main


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """Invoke ``treeattn ARGS...`` as the console script does (errors rendered, exit codes)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    from treeattn import cli

    old = cli.err_console.file
    cli.err_console.file = err
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        cli.err_console.file = old
    return CliResult(code, out.getvalue(), err.getvalue())


def read_fifo(path: Path) -> tuple[threading.Thread, list[bytes]]:
    """A thread reading the FIFO ``path`` to its end (started: it waits for a writer), and the
    list its bytes land in."""
    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, got
