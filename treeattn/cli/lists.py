"""Comma-separated flag values (``--batches 1,4,16``, ``--parents -1,0,0``), read one way.

An empty item (``1,,2``, ``1,``) is a slip, not a value left out, and is refused naming its
place; an integer is digits with an optional minus sign and nothing else (``int()`` would read
``1_6`` as 16 and `` 1 `` as 1).
"""

from __future__ import annotations

import re

from treeattn.errors import InputError

__all__ = ["comma_items", "int_items"]

_INTEGER = re.compile(r"-?[0-9]+")


def comma_items(text: str, flag: str, what: str, *, distinct: bool = False) -> list[str]:
    """The items of ``text`` (``flag``'s value), stripped; ``what`` names them in the error
    ("family names"). ``distinct``: an item given twice is refused too."""
    items = [x.strip() for x in text.split(",")]
    if not any(items):
        raise InputError(f"{flag} {text!r} names nothing")
    if "" in items:
        raise InputError(f"{flag} {text!r}: item {items.index('') + 1} is empty; write {what} separated by commas")
    if distinct and (twice := next((x for i, x in enumerate(items) if x in items[:i]), None)):
        raise InputError(f"{flag} {text!r} names {twice} twice")
    return items


def int_items(text: str, flag: str, *, least: int | None = None, distinct: bool = False) -> list[int]:
    """The integers of ``text`` (``flag``'s value), each at least ``least`` where given."""
    what = "positive integers" if least == 1 else "integers"
    items = comma_items(text, flag, what)
    values = []
    for i, item in enumerate(items, start=1):
        if not _INTEGER.fullmatch(item):
            raise InputError(f"{flag} {text!r}: item {i} ({item!r}) is not an integer; write {what} separated by "
                             "commas")
        value = int(item)
        if least is not None and value < least:
            raise InputError(f"{flag} {text!r}: item {i} ({value}) must be at least {least}")
        values.append(value)
    if distinct and (twice := next((v for i, v in enumerate(values) if v in values[:i]), None)) is not None:
        raise InputError(f"{flag} {text!r} names {twice} twice")
    return values
