"""The console script's entry point (``treeattn``, ``python -m treeattn``): imports nothing but
the standard library before the command's modules, so that Ctrl-C while they load (a few tenths
of a second) ends as one interrupted command does, with one line and status 130, not a
traceback (``treeattn.cli.main`` handles the signals while the command runs; one that lands as
it installs or removes its handlers is caught here too)."""

from __future__ import annotations

import sys


def main() -> None:
    """Load the command line and run it."""
    from treeattn.stdio import prepare_streams

    prepare_streams()
    try:
        from treeattn.cli import built_command
        from treeattn.cli import main as run

        built_command()
        run()
    except KeyboardInterrupt as exc:  # outside the command's own handling: before it, or as it ends
        from treeattn.interrupts import exit_status

        sys.stderr.write("aborted\n")
        raise SystemExit(exit_status(exc)) from None
