"""Progress of a long command (the search, a comparison) on stderr.

On a terminal a bar with done/total; otherwise (a log, CI) a line every ``PROGRESS_EVERY_S``
seconds from a timer thread, so that a long search shows it is alive even between its steps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from treeattn.cli import err_console

__all__ = ["PROGRESS_EVERY_S", "progress_reporter"]

PROGRESS_EVERY_S = 10.0
"""When stderr is not a terminal (a log, CI), a progress line at most this often."""


@contextmanager
def progress_reporter(enabled: bool | None, what: str) -> Iterator[Any]:
    """Progress on stderr (None: on, False: off): a bar with done/total on a terminal, else a
    line every ``PROGRESS_EVERY_S`` seconds, so a long search in a log shows it is alive."""
    if enabled is False:
        yield None
        return
    if not err_console.is_terminal:
        state = ["starting", 0, 0]
        stop = threading.Event()

        def report() -> None:
            start = time.monotonic()
            while not stop.wait(PROGRESS_EVERY_S):
                stage, done, total = state
                err_console.print(f"{what}: {stage}: {done:,}/{total:,} steps, {time.monotonic() - start:.0f} s",
                                  markup=False)

        def update(done: int, total: int, stage: str) -> None:
            state[:] = [stage, done, total]

        ticker = threading.Thread(target=report, daemon=True)
        ticker.start()
        try:
            yield update
        finally:
            stop.set()
            ticker.join()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task(what, total=None)

        def update(done: int, total: int, stage: str) -> None:
            bar.update(task, completed=done, total=total, description=stage)

        yield update
