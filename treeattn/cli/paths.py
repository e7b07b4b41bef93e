"""Where a command writes: one rule for every output path, checked before any work.

* A path that is an existing folder, or ends in a slash, means a file inside it, named
  ``default_name`` (an empty path is refused: ``out_path`` reads the options).
* An image path without ``.png`` gets it (matplotlib would add it anyway), so the path a
  command prints is the file it wrote; one whose suffix names another kind of file
  (``x.txt``, ``x.svg``: ``OTHER_KINDS``) is refused rather than written as ``x.txt.png``.
  A dotted name (``dgx.b1.n1M``) is no other kind and gets ``.png``.
* A text output (a CSV, a YAML file) whose suffix names another kind of file (``run --out
  x.png``, ``plan -o p.json``) is refused too: it would have been written as named, a CSV in a
  ``.png``. Other names are written as given (``rows.txt``, ``plan.out``).
* ``-`` is standard output (``/dev/stdout``), as most tools read it (so is ``./-``, which a path
  reads as ``-``); a file named ``-`` is given with its folder (``$PWD/-``).
* Missing parent folders are created, as most tools do.
* A path that cannot be written (a file in the way of a folder, no permission, an output
  that is itself a folder, a read-only file system: the file is opened once to see) is bad
  input: exit 2 and one line, before measuring or searching.
* A command that fails takes back the folders it created and left empty (``kept_on_success``):
  a run refused after its ``--out`` was checked leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from treeattn import stdio
from treeattn.errors import InputError
from treeattn.interrupts import before_hard_exit
from treeattn.textfile import OTHER_KINDS, TEXT_KINDS, special_file, wrong_kind

__all__ = ["OUT_PATH", "TEXT_KINDS", "FolderPath", "appendable", "kept_on_success", "out_path", "output_file",
           "output_folder", "safe_name"]

_CREATED: list[Path] = []
"""The folders this command created, each after its parent."""


def safe_name(text: str) -> str:
    """``text`` as a file name: runs of anything but letters, digits, ``_.-`` become ``-``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


@contextlib.contextmanager
def kept_on_success() -> Iterator[None]:
    """Run a command; where it exits with an error, remove the folders it created that are
    still empty (what it wrote stays, and so do the folders that hold it)."""
    _CREATED.clear()

    def remove_created() -> None:
        for folder in reversed(_CREATED):
            with contextlib.suppress(OSError):  # not empty, or gone
                folder.rmdir()

    try:
        with before_hard_exit(remove_created):  # registered first, so run after the files' own cleanups
            yield
    except BaseException as exc:
        if not isinstance(exc, SystemExit) or exc.code not in (0, None):
            remove_created()
        raise
    finally:
        _CREATED.clear()


def _is_file(path: Path) -> bool:
    """Whether something other than a folder has that name (False where it cannot be looked up)."""
    try:
        return path.exists() and not path.is_dir()
    except OSError:  # a name too long, say
        return False


def _make_folder(folder: Path, flag: str, shown: Path) -> None:
    try:
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        for p in reversed(missing):  # top down, each one this command made noted as soon as made
            try:
                p.mkdir()
            except FileExistsError:
                if not p.is_dir():
                    raise
                continue  # made meanwhile by another process (another rank of the run): not ours
            _CREATED.append(p)
        folder.mkdir(parents=True, exist_ok=True)  # what was there already: folders, or an error
    except OSError as exc:
        # mkdir's "File exists" does not say which part of the path is in the way.
        file = next((p for p in (folder, *folder.parents) if _is_file(p)), None)
        why = (exc.strerror or exc if file is None else "a file has that name" if file == folder
               else f"{str(file)!r} is a file")
        raise InputError(f"{flag} {str(shown)!r}: cannot create folder {str(folder)!r}: {why}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {str(shown)!r}: folder {str(folder)!r} is not writable")


class FolderPath(type(Path())):  # type: ignore[misc]
    """An output path given with a trailing slash (``-o plans/``): a folder, made where missing,
    the file inside it named as the command names it (``out_path`` reads it so)."""


def out_path(value: str) -> Path:
    """An output option's path as typed: an empty one is refused (it would mean the current
    folder), and one ending in a slash is a ``FolderPath``."""
    import typer

    if not value.strip():
        raise typer.BadParameter("an empty path; give a file or folder")
    return FolderPath(value) if value.endswith(("/", os.sep)) else Path(value)


OUT_PATH = {"parser": out_path, "metavar": "<path>"}
"""What an output option passes to ``typer.Option``: ``out_path`` reads it, --help shows <path>."""


def output_file(path: Path, flag: str, default_name: str, *, suffix: str | None = None,
                kind: str | None = None) -> Path:
    """The file a command will write for ``flag`` (see the module docstring), its folder made.

    Args:
        path: what the user gave.
        flag: the option, for messages (``--out``).
        default_name: the file's name when ``path`` is an existing folder.
        suffix: the suffix the file must have (``.png``), added when missing.
        kind: what a text output holds (``CSV``, ``YAML``, ``plan``: ``TEXT_KINDS``); a suffix
            naming another kind of file is refused.

    Returns:
        The path to write and to print.

    Raises:
        InputError: the path cannot be written.
    """
    folder = isinstance(path, FolderPath)
    given = Path(path).expanduser()
    if str(path) == "-":  # standard output, as most tools read it (a file named '-' is ./-)
        given = Path("/dev/stdout")
    try:
        out = given / default_name if folder or given.is_dir() else given
        # A device or pipe (``/dev/stdout``, a FIFO) is written as named: a suffix would make a file beside it.
        if suffix is not None and out.suffix.lower() != suffix and not special_file(out):
            if out.suffix.lower() in OTHER_KINDS:
                raise InputError(f"{flag} {str(given)!r}: a {out.suffix} name for a {suffix[1:].upper()} "
                                 f"image; end it in {suffix} (or leave the suffix out: {suffix} is added)")
            out = out.with_name(out.name + suffix)
        if kind is not None and (why := wrong_kind(out, kind)):
            raise InputError(f"{flag} {str(given)!r}: {why}")
        if out.is_dir():
            raise InputError(f"{flag} {str(given)!r}: {str(out)!r} is a folder; give a file name")
        _make_folder(out.parent, flag, given)
        # Asked again after access: another rank's check of the same name may have made and
        # removed it meanwhile, and access finds no file as unwritable.
        if out.exists() and not os.access(out, os.W_OK) and out.exists():
            raise InputError(f"{flag} {str(given)!r}: {str(out)!r} is not writable")
    except OSError as exc:  # a name the system cannot look up (too long, say)
        raise InputError(f"{flag} {str(given)!r}: {exc.strerror or exc}") from None
    # fd 1 is the null device then (treeattn.stdio): /dev/null itself is written as asked
    if stdio.stdout_closed and os.path.abspath(out) != os.devnull and _is_stdout(out):
        raise InputError(f"{flag} {str(given)!r}: standard output is closed (>&-); give a file")
    appendable(out, flag)
    if _is_stdout(out):
        # `plan -o /dev/stdout | treeattn verify /dev/stdin`: the file is what stdout carries, and
        # the command's own table, lines and --json go to stderr (main() puts stdout back after).
        sys.stdout = sys.stderr
    return out


def _is_stdout(path: Path) -> bool:
    """Whether ``path`` is the file this process's standard output writes to."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(1))
    except (OSError, ValueError):
        return False


def appendable(file: Path, flag: str) -> None:
    """Open ``file`` for appending and leave it as it was (removed again where this made it):
    a permission check cannot see a read-only file system, nor what root may not write
    (``/sys``, say), which the command would otherwise find only once its work is done."""
    made = None
    try:
        # A link is written through: the file this makes and removes is its target, and the
        # link stays (removing the name opened would take a dangling link away, its target made).
        # A link to a device or pipe is opened as named (/dev/stdout on a pipe resolves to no path).
        real = Path(os.path.realpath(file)) if file.is_symlink() and not special_file(file) else file
        if _is_pipe(real):
            # Opened and closed, a pipe tells the program reading it that the output has ended
            # (and, with no reader, the open would wait for one): its permission must do.
            if not os.access(real, os.W_OK):
                raise PermissionError(13, os.strerror(13), str(file))
            return
        for _ in range(2):
            try:
                with real.open("x", encoding="utf-8"):  # made here: no other process writes it yet
                    made = real
                break
            except FileExistsError:
                try:
                    # Not made here: the ranks of one run check the same names at once, and the
                    # file another's check made may be gone again (opened to append, it would
                    # be made and left behind).
                    os.close(os.open(real, os.O_WRONLY | os.O_APPEND))
                    break
                except FileNotFoundError:
                    continue
        # Else both tries met another rank's check between its make and its remove: it could
        # write there, and so can this one.
    except OSError as exc:
        raise InputError(f"cannot write {flag} {str(file)!r}: {exc.strerror or exc}") from None
    finally:
        if made is not None:
            with contextlib.suppress(OSError):
                made.unlink()


def _is_pipe(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(path.stat().st_mode)
    except OSError:
        return False


def output_folder(path: Path, flag: str) -> Path:
    """A folder a command writes into, created (with its parents) and checked writable."""
    given = Path(path).expanduser()
    try:
        if given.exists() and not given.is_dir():
            raise InputError(f"{flag} {str(given)!r} is a file; give a folder")
        _make_folder(given, flag, given)
    except OSError as exc:  # a name the system cannot look up (too long, say)
        raise InputError(f"{flag} {str(given)!r}: {exc.strerror or exc}") from None
    return given
