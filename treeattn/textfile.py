"""Reading the text files a user gives (topologies, plans, workloads, tool output): one way,
so that a folder, a missing file, binary data or another encoding is one located error,
never a traceback. Writing the files a command makes (plans, topologies, CSVs, JSON,
figures): one way too, so that a write that fails (a full disk, a file size limit, an
interrupt) leaves the file there before as it was, never a truncated one.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from treeattn.errors import InputError

__all__ = ["read_text", "write_file", "append_file", "special_file", "OTHER_KINDS", "TEXT_KINDS", "wrong_kind",
           "keep_foreign_file"]

OTHER_KINDS = frozenset({".txt", ".log", ".csv", ".tsv", ".json", ".yaml", ".yml", ".html", ".md", ".jpg", ".jpeg",
                         ".svg", ".svgz", ".pdf", ".eps", ".ps", ".tif", ".tiff", ".webp", ".gif", ".bmp"})
"""Suffixes of files that are not PNG images: an image option refuses them."""
TEXT_KINDS: dict[str, tuple[str, ...]] = {"CSV": (".csv", ".txt", ".log"), "YAML": (".yaml", ".yml", ".txt"),
                                          "plan": (".yaml", ".json", ".yml", ".txt")}
"""The suffixes a text output of each kind takes among those that name a kind of file (``OTHER_KINDS``, ``.png``);
the first (two, for a plan: YAML or JSON) are what the refusal suggests."""


def wrong_kind(path: str | Path, kind: str) -> str | None:
    """Why ``path`` is no name for a text output of ``kind`` (``TEXT_KINDS``): its suffix names
    another kind of file (``a .csv name for a plan file; end it in .yaml or .json``); None
    where it does not (any other suffix, or none)."""
    suffix = Path(path).suffix
    if suffix.lower() in OTHER_KINDS | {".png"} and suffix.lower() not in TEXT_KINDS[kind]:
        ends = " or ".join(TEXT_KINDS[kind][:2 if kind == "plan" else 1])
        return f"a {suffix} name for a {kind} file; end it in {ends}"
    return None

_UTF16 = (b"\xff\xfe", b"\xfe\xff")


def keep_foreign_file(path: Path, is_ours: Callable[[Path], bool], what: str, lacks: str, writes: str) -> None:
    """Refuse to write over a regular file that is not one of the command's kind (``is_ours``
    says, reading it): an output path given wrong (a plan's, a script's, someone's notes)
    would lose that file for good. An empty file, a device, and a file that cannot be read (the
    write then says what is wrong) pass.

    Raises:
        InputError: ``{path}: the file there is not a treeattn {what} ({lacks}); not replaced:
            remove it or write the {writes} elsewhere``.
    """
    try:
        if not path.is_file() or path.stat().st_size == 0 or is_ours(path):
            return
    except OSError:
        return
    raise InputError(f"{path}: the file there is not a treeattn {what} ({lacks}); not replaced: remove it or "
                     f"write the {writes} elsewhere")


def read_text(path: str | Path, what: str, error: type[InputError] = InputError, *, strict: bool = True) -> str:
    """The text of ``path``, UTF-8 (a leading byte-order mark is dropped).

    Args:
        path: the file.
        what: what it should be, for messages ("topology file").
        error: the error class to raise (a subclass of ``InputError``).
        strict: refuse bytes that are not UTF-8; False replaces them (tool output, which its
            parser then reports line by line).

    Returns:
        The text.

    Raises:
        error: the file is missing, a folder, unreadable, binary, or not UTF-8 (when strict).
    """
    p = Path(path)
    where = f"cannot read {what} {str(p)!r}"
    try:
        data = _read_bounded(p, where, error)
    except FileNotFoundError:
        raise error(f"{where}: no such file") from None
    except IsADirectoryError:
        raise error(f"{where}: it is a folder") from None
    except OSError as exc:
        raise error(f"{where}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        if not strict:
            return data.decode("utf-8-sig", errors="replace")
        raise error(f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as "
                    "UTF-8") from None


MAX_TEXT_BYTES = 1 << 30
"""The most a text input may hold: a device or pipe that never ends (``/dev/zero``, ``<(yes)``)
is refused at this size rather than read until memory runs out."""
_CHUNK = 1 << 20


_GZIP = b"\x1f\x8b"
"""The first two bytes of a gzip file (RFC 1952): a compressed log is named as such."""


def _read_bounded(p: Path, where: str, error: type[InputError]) -> bytes:
    """``p``'s bytes, read a chunk at a time: binary data (a NUL byte) is refused as soon as it
    is read, and more than ``MAX_TEXT_BYTES`` at that size."""
    parts: list[bytes] = []
    size = 0
    with p.open("rb") as f:
        while chunk := f.read(_CHUNK):
            if not parts and chunk.startswith(_UTF16):  # its NULs are text's, not binary data
                raise error(f"{where}: it is UTF-16 text; save it as UTF-8")
            if not parts and chunk.startswith(_GZIP):
                raise error(f"{where}: gzip-compressed data, not text; gunzip it first")
            nul = chunk.find(b"\x00")
            if nul >= 0:
                raise error(f"{where}: binary data (a NUL byte at offset {size + nul}), not text")
            size += len(chunk)
            if size > MAX_TEXT_BYTES:
                raise error(f"{where}: more than {MAX_TEXT_BYTES >> 20} MiB, not a text file this reads")
            parts.append(chunk)
    return b"".join(parts)


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # Reading the mask means setting it: a brief window another thread creating a file could see.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _located(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path`` (the file the user named), not a temporary one."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path)) if exc.errno else exc


def _target(path: Path) -> Path:
    # A link is written through: the file replaced is its target, and the link stays. A link to
    # a device or pipe is written as named: /dev/stdout on a pipe resolves to no path
    # ('/proc/PID/fd/pipe:[N]').
    return Path(os.path.realpath(path)) if path.is_symlink() and not special_file(path) else path


def special_file(path: str | Path) -> bool:
    """Whether ``path`` is there and neither a regular file nor a folder: a device or a pipe,
    which an output is written into as named (no suffix added, no file made beside it)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _write_in_place(real: Path, path: Path, payload: bytes, flags: int) -> Path:
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        raise _located(exc, path) from None
    try:
        _write_all(fd, payload)
    except OSError as exc:
        raise _located(exc, path) from None
    finally:
        os.close(fd)
    return path


def write_file(path: str | Path, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` whole or not at all: into a new file beside it, flushed to
    disk, then renamed over it. A failure leaves an existing file byte for byte as it was and
    no temporary file behind.

    The file keeps the permission bits (and, where the writer may set them, the owner and
    group) of the one it replaces; a new one gets those the umask gives (not ``mkstemp``'s
    0600). A file the writer may not write is refused, as writing in place would; hard links to
    the old file keep the old content. Written in place, without that guarantee: a device or
    a pipe (which, as a shell redirect does, waits for a reader), and a writable file in a
    folder the writer may not create files in.

    Args:
        path: the file; its folder must exist.
        data: text (encoded with ``encoding``) or bytes.
        encoding: for text.

    Returns:
        ``path``.

    Raises:
        OSError: the file cannot be written; its ``filename`` is ``path``.
    """
    path = Path(path)
    payload = data.encode(encoding) if isinstance(data, str) else bytes(data)
    real = _target(path)
    if special_file(real):
        # A device or a pipe (``-o /dev/null``, a FIFO a reader waits on) takes the bytes as
        # they come: renamed over, it would become a plain file (as root, /dev/null itself).
        return _write_in_place(real, path, payload, os.O_WRONLY)
    # Renaming over a file needs only the folder writable: a file made read-only to keep it stays.
    if real.exists() and not real.is_dir() and not os.access(real, os.W_OK):
        raise PermissionError(13, os.strerror(13), str(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    except PermissionError as exc:
        if real.is_file():  # a writable file in a folder we may not add to: only in place
            return _write_in_place(real, path, payload, os.O_WRONLY | os.O_TRUNC)
        raise _located(exc, path) from None
    except OSError as exc:
        raise _located(exc, path) from None
    try:
        try:
            old = os.stat(real)
        except FileNotFoundError:
            os.fchmod(fd, 0o666 & ~_umask())
        else:
            with contextlib.suppress(OSError, AttributeError):  # only root may give a file away
                os.fchown(fd, old.st_uid, old.st_gid)
            os.fchmod(fd, stat.S_IMODE(old.st_mode))
        _write_all(fd, payload)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, real)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _located(exc, path) from None
        raise
    with contextlib.suppress(OSError):  # the rename itself on disk; not every file system can
        folder = os.open(real.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return path


def append_file(path: str | Path, data: str | bytes, *, header: str | bytes = b"",
                encoding: str = "utf-8") -> Path:
    """Append ``data`` to ``path`` (created when missing) whole or not at all: a failed write
    cuts the file back to its length before, so the rows there stay and no half row follows.

    Appending, not replacing, so that runs sharing one file each add their rows: the file is
    locked while it is written (where the system has ``flock``), and ``header`` goes first
    when the file is empty at that moment.

    Args:
        path: the file; its folder must exist.
        data: text (encoded with ``encoding``) or bytes.
        header: written before ``data`` into an empty file.
        encoding: for text.

    Returns:
        ``path``.

    Raises:
        OSError: the file cannot be written; its ``filename`` is ``path``.
    """
    path = Path(path)
    body = data.encode(encoding) if isinstance(data, str) else bytes(data)
    head = header.encode(encoding) if isinstance(header, str) else bytes(header)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as exc:
        raise _located(exc, path) from None
    try:
        with contextlib.suppress(ImportError, OSError):
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a device or a pipe (/dev/null): no length to cut back to, no fsync
            _write_all(fd, head + body)
            return path
        size = info.st_size
        try:
            _write_all(fd, (head if size == 0 else b"") + body)
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    except OSError as exc:
        raise _located(exc, path) from None
    finally:
        os.close(fd)  # and the lock with it
    return path
