"""Small helpers shared by the text parsers: located errors and reading inputs."""

from __future__ import annotations

from pathlib import Path

from treeattn.errors import ProbeError
from treeattn.textfile import read_text

__all__ = ["fail", "read_input"]


def fail(source: str, line: int | None, what: str) -> ProbeError:
    """A ProbeError naming the input and line (1-based), ready to raise."""
    where = f"{source}:{line}" if line else source
    return ProbeError(f"{where}: {what}")


def read_input(path: str | Path, what: str) -> str:
    """Read a tool-output file as text, with an error naming it when that fails.

    Args:
        path: the file.
        what: which tool's output it should be (for the message).

    Returns:
        The text (undecodable bytes replaced, so garbage is reported by the parser).
    """
    return read_text(path, f"{what} file", ProbeError, strict=False)
