"""Reading the text files a user gives (topologies, plans, workloads, tool output): one way,
so that a folder, a missing file, binary data or another encoding is one located error,
never a traceback.
"""

from __future__ import annotations

from pathlib import Path

from treeattn.errors import InputError

__all__ = ["read_text"]

_UTF16 = (b"\xff\xfe", b"\xfe\xff")


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
        data = p.read_bytes()
    except FileNotFoundError:
        raise error(f"{where}: no such file") from None
    except IsADirectoryError:
        raise error(f"{where}: it is a folder") from None
    except OSError as exc:
        raise error(f"{where}: {exc.strerror or exc}") from None
    if data.startswith(_UTF16):
        raise error(f"{where}: it is UTF-16 text; save it as UTF-8")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise error(f"{where}: binary data (a NUL byte at offset {nul}), not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        if not strict:
            return data.decode("utf-8-sig", errors="replace")
        raise error(f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as "
                    "UTF-8") from None
