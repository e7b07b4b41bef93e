"""Units and sizes, defined once.

Legend: ``_gbps`` is GB/s (10^9 bytes per second, per direction), ``_us`` microseconds,
``_bytes`` bytes. Bytes per microsecond equal ``gbps * 1e3``.
"""

from __future__ import annotations

import re
from decimal import Decimal
from enum import StrEnum

from treeattn.errors import InputError

__all__ = ["DType", "MAX_BYTES", "FIXED_MAX", "parse_size", "check_bytes", "counted", "fixed", "format_size",
           "format_sizes", "transfer_us"]

MAX_BYTES = 1 << 40
"""The largest buffer a rank may hold, 1 TiB: more than any one device's memory. A size a user
gives past it is refused where it is read (sizes near 2^60 bytes overflowed the simulator's
64-bit byte counts). On host ranks, with no device memory to check, a plan near it still
takes long: gloo's library baseline is simulated 1 MiB segment by segment."""


class DType(StrEnum):
    """Element types of KV caches and partials."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"

    @property
    def nbytes(self) -> int:
        """Bytes per element (a constant lookup: searches call this hundreds of thousands of times)."""
        return _NBYTES[self]

    @classmethod
    def parse(cls, text: str) -> DType:
        aliases = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16",
                   "half": "fp16", "float8": "fp8"}
        key = aliases.get(str(text).lower(), str(text).lower())
        try:
            return cls(key)
        except ValueError:
            choices = ", ".join(d.value for d in cls)
            raise InputError(f"unknown dtype {text!r}; choose one of {choices}") from None


_NBYTES: dict[DType, int] = {DType.FP32: 4, DType.BF16: 2, DType.FP16: 2, DType.FP8: 1}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtTpP]?)(i?)([bB]?)\s*$")
_POW = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str | int, what: str = "size", *, least: int = 0, least_text: str | None = None) -> int:
    """Parse a byte size written as text: ``"16KB"``, ``"1MiB"``, ``"4096"``, ``"2M"``.

    Args:
        text: the size; KB/MB/GB are powers of 1000; KiB/MiB/GiB and a bare K/M/G powers of
            1024, as nccl-tests reads its ``-b``/``-e`` sizes and as token counts are read
            (``1K`` is 1024 wherever treeattn reads a count).
        what: how error messages name the value (the flag or field it came from).
        least: the smallest size allowed, in bytes; a size below it, negative or not, is refused
            with one message: ``WHAT must be at least LEAST_TEXT`` (default ``N bytes``).
        least_text: how that message says ``least`` (``one fp32 element (4 bytes)``).

    Returns:
        The size in bytes, >= ``least``.
    """
    def too_small() -> InputError:
        if least <= 0:
            return InputError(f"{what} must be >= 0, got {text!r}")
        return InputError(f"{what} must be at least {least_text or counted(least, 'byte')}, got {text!r}")

    if isinstance(text, int):
        if text < max(least, 0):
            raise too_small()
        return check_bytes(text, what)
    m = _SIZE.match(str(text))
    if not m:
        if _SIZE.match(str(text).strip().removeprefix("-")):
            raise too_small()
        raise InputError(f"cannot read {what} {text!r}; write it like 4096, 16KB, 1MiB or 2GB")
    num, prefix, binary, unit = m.groups()
    if unit == "b":  # 1Gb: a gigabit, as links are sold, is 125 MB (1Gib a gibibit, 8b a byte)
        if not prefix:
            raise InputError(f"{what} {text!r}: a lower-case b is bits; write {num}B or {num} for bytes")
        raise InputError(f"{what} {text!r}: a lower-case b is bits; write {num}{prefix.upper()}B (powers of 1000) "
                         f"or {num}{prefix.upper()}iB (of 1024) for bytes")
    base = 1024 if binary or not unit else 1000
    nbytes = Decimal(num) * base ** _POW[prefix.lower()]  # exact: 1.1MB is 1,100,000 bytes
    if nbytes != nbytes.to_integral_value():
        raise InputError(f"{what} {text!r} is not a whole number of bytes")
    if nbytes < least:
        raise too_small()
    return check_bytes(int(nbytes), what, text)


def check_bytes(nbytes: int, what: str = "size", text: str | None = None) -> int:
    """``nbytes``, or ``InputError`` naming ``what`` (as written: ``text``) when it exceeds ``MAX_BYTES``."""
    if nbytes > MAX_BYTES:
        size = f"{text!r} is over" if text is not None else f"is {format_size(nbytes)}, over"
        raise InputError(f"{what} {size} {format_size(MAX_BYTES)}, more than any device's memory")
    return nbytes


_SIZE_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def _size_unit(nbytes: float) -> tuple[str, int]:
    return next(((u, s) for u, s in _SIZE_UNITS if nbytes >= s), ("B", 1))


def format_size(nbytes: float) -> str:
    """Short human form of a byte count, powers of 1024 (as nccl-tests prints)."""
    unit, scale = _size_unit(nbytes)
    return f"{int(nbytes)} B" if scale == 1 else f"{nbytes / scale:.4g} {unit}"


def format_sizes(a: float, b: float) -> tuple[str, str]:
    """``format_size`` of two counts a message sets side by side (a need and the limit it is
    over), with as many more digits, in the larger's unit, as tell two different counts apart
    (``72 GiB`` over ``72 GiB`` reads as if it fitted), else their bytes."""
    sa, sb = format_size(a), format_size(b)
    if sa != sb or a == b:
        return sa, sb
    unit, scale = _size_unit(max(a, b))
    for digits in range(5, 13):
        sa, sb = f"{a / scale:.{digits}g} {unit}", f"{b / scale:.{digits}g} {unit}"
        if sa != sb:
            return sa, sb
    return f"{int(a):,} B", f"{int(b):,} B"


def counted(n: int, noun: str) -> str:
    """``n`` with ``noun``, plural unless one: ``1 rank``, ``8 ranks``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


FIXED_MAX = 1e12
"""From here on ``fixed`` writes a number in e-notation (1e12 µs is about 12 days)."""


def fixed(x: float, digits: int = 2, width: int = 0) -> str:
    """``x`` with ``digits`` decimals (``f"{x:.2f}"``), right-aligned to ``width``; from
    ``FIXED_MAX`` on, 4 significant digits in e-notation: a time on a link of ``bw_gbps: 1e-300``
    (a valid positive number) printed some 300 digits in full."""
    if abs(x) >= FIXED_MAX:  # inf too
        return f"{x:{width}.3e}"
    return f"{x:{width}.{digits}f}"


def transfer_us(nbytes: float, bw_gbps: float) -> float:
    """Time to move ``nbytes`` at ``bw_gbps`` (GB/s), in microseconds."""
    return nbytes / (bw_gbps * 1e3)
