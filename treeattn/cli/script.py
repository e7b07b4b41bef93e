"""Bad input to a script of this repository (``benchmarks/``) ends as the CLI's does: one line
on stderr naming what is wrong, exit status 2, no traceback and no usage block.

A script builds its parser with ``ArgumentParser``, reads lists and counts with the types
below (argparse turns their errors into its own), and runs ``main`` through ``run``, which
renders the ``TreeattnError`` a library call raises on a bad value as the CLI renders it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from treeattn.errors import TreeattnError
from treeattn.units import parse_size

__all__ = ["ArgumentParser", "count", "count_list", "run", "size_list"]


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (argparse writes the usage block first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def count(text: str, low: int = 1) -> int:
    """A whole number >= ``low`` (a count of calls, repeats, ranks...)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < low:
        raise argparse.ArgumentTypeError(f"must be >= {low} (got {text!r})")
    return n


def count_list(text: str) -> list[int]:
    """Whole numbers >= 1 separated by commas (``1,16,128``)."""
    try:
        return [count(x.strip()) for x in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers >= 1 separated by commas") from None


def size_list(text: str) -> list[int]:
    """Byte sizes separated by commas (``16KB,1MB``), as ``treeattn.units.parse_size`` reads them."""
    try:
        sizes = [parse_size(x.strip()) for x in text.split(",")]
    except TreeattnError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if 0 in sizes:
        raise argparse.ArgumentTypeError(f"{text!r}: a size of 0 bytes")
    return sizes


def run(main: Callable[[], object]) -> int:
    """``main()``'s status (None: 0); a ``TreeattnError`` it raises is one line on stderr and
    its exit code (2 for bad input)."""
    try:
        rc = main()
    except TreeattnError as exc:
        sys.stderr.write(f"{sys.argv[0].rsplit('/', 1)[-1]}: error: {' '.join(str(exc).split())}\n")
        return exc.exit_code
    return int(rc or 0)
