"""The standard streams as a command finds them, made usable before anything is opened
(``treeattn.entry``; standard library only).

A descriptor 0, 1 or 2 that the caller closed (``treeattn plan ... >&-``) would be the first one
the process opens next, and whatever it opened there (a plan file, a pipe to a child) would then
take what the command prints, or be read as its input (``verify /dev/stdin <&-`` waited forever
on a pipe of its own). Each closed one gets the null device instead; ``stdout_closed`` says that
standard output was closed, so ``-o -`` is refused rather than written nowhere. An encoding that
cannot write every character the tables use (``PYTHONIOENCODING=ascii``, "µs") writes them as
escapes, and a ``COLUMNS`` that is no positive width (``COLUMNS=0``: rich printed nothing, error
lines included) is dropped."""

from __future__ import annotations

import io
import os
import sys

__all__ = ["prepare_streams", "stdout_closed"]

stdout_closed = False
"""Whether standard output was closed when the command began (``prepare_streams``)."""


def prepare_streams() -> None:
    """Open the null device on each closed standard descriptor, escape what the streams'
    encodings cannot write, and drop a ``COLUMNS`` that is no positive width."""
    global stdout_closed
    for fd, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, mode)
            if null != fd:  # the lowest free descriptor: this one, unless a lower one is closed too
                os.dup2(null, fd)
                os.close(null)
            if fd == 1:
                stdout_closed = True
            name = ("stdin", "stdout", "stderr")[fd]
            if getattr(sys, name) is None:  # Python found it closed at start-up
                setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "r" if fd == 0 else "w", closefd=False),
                                                    encoding="utf-8", write_through=fd == 2))
    for stream in (sys.stdout, sys.stderr):
        try:
            "µ×—".encode(stream.encoding)
        except (UnicodeEncodeError, LookupError, AttributeError, TypeError):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="backslashreplace")
    columns = os.environ.get("COLUMNS")
    if columns is not None and not (columns.isascii() and columns.strip().isdigit() and int(columns) > 0):
        del os.environ["COLUMNS"]
