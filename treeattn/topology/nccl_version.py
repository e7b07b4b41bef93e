"""NCCL releases: how a published table names the NCCL it ran, and the release the model
takes for it.

The model follows NCCL 2.19-2.30 (``NEWEST`` is its default). A few of ``tuning.cc``'s
figures changed in that span (``treeattn.cost.nvls``: NVLS's latencies and NCCL's own
NVLS/NVLSTree estimate; ``treeattn.cost.nccl``: NCCL's estimate of ring LL and LL128;
``treeattn.cost.nccl_p2p``: whether PXN reaches a NIC through Grace); the model chooses them
by release. A version is written

* ``2.26.2``: that release;
* ``2.26``: some 2.26 release;
* ``<2.28`` or ``<=2.27.3``: a bound argued from evidence (a table posted before 2.28's
  release);
* ``unknown``: nothing bounds it.

The model takes the newest release the text allows (``2.26`` and ``<=2.26`` as the last 2.26,
``<2.28`` as the last 2.27, ``unknown`` as ``NEWEST``): the same rule as its default, and
inside one of the spans in which a figure holds any release gives the same figures.
"""

from __future__ import annotations

import re
from typing import TypeVar

from treeattn.errors import InputError

__all__ = ["NEWEST", "OLDEST", "UNKNOWN", "allows", "parse_version", "version_flag", "version_text", "nccl_release",
           "release_text", "by_release", "newer_note"]

Release = tuple[int, int, int]
NEWEST: Release = (2, 30, 7)
"""The newest NCCL release whose tuning.cc the model follows (tag v2.30.7-1)."""
OLDEST: Release = (2, 19, 1)
"""The oldest release the model's figures cover (tag v2.19.1-1)."""
UNKNOWN = "unknown"
_ANY_PATCH = 999
_T = TypeVar("_T")
_FORM = re.compile(r"^(<=|<)?\s*(\d+)\.(\d+)(?:\.(\d+))?$")


def parse_version(text: str) -> Release | None:
    """The newest release ``text`` allows (module docstring); None for ``unknown``.

    Raises:
        InputError: ``text`` is none of the forms above (the message says which are).
    """
    m = _FORM.match(str(text).strip())
    if str(text).strip() == UNKNOWN:
        return None
    if m is None:
        raise InputError(f"version {text!r}: write a release (2.26.2), a series (2.26), a bound (<2.28, <=2.27.3) "
                         f"or {UNKNOWN}")
    bound, major, minor, patch = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
    release = (major, minor, _ANY_PATCH if patch is None else int(patch))
    if bound != "<":
        return release
    if patch is not None and int(patch) > 0:
        return (major, minor, int(patch) - 1)
    if minor > 0:
        return (major, minor - 1, _ANY_PATCH)
    raise InputError(f"version {text!r}: bound it by a series (<2.31, <=2.27.3), not by a major release")


def allows(text: str, printed: str) -> bool:
    """Whether a version as a user gives it (``text``: a release, a series or a bound) allows
    the release a log prints: the same release, or one no newer than a series' or a bound's;
    True where either reads as no release (``unknown``, an unreadable printed one)."""
    try:
        given, release = parse_version(text), parse_version(printed)
    except InputError:
        return True
    if given is None or release is None:
        return True
    if text.strip().startswith("<"):
        return release <= given
    return release == given if text.strip().count(".") == 2 else release[:2] == given[:2]


def version_flag(value: object) -> str:
    """``--nccl-version``'s value as ``parse_version`` reads it, checked: the form NCCL prints
    (``2.26.2+cuda12.8``) without its build, the form treeattn prints a series in (``2.27.x``)
    as the series (``2.27``).

    Raises:
        InputError: not a version (the message names the flag)."""
    try:
        text = version_text(value).strip().split("+", 1)[0].strip()
        text = text[:-2] if text.endswith(".x") else text
        parse_version(text)
    except InputError as exc:
        raise InputError(f"--nccl-version: {exc}") from None
    return text


def version_text(value: object) -> str:
    """``value`` as a version's text, or InputError: YAML reads an unquoted 2.30 as the
    number 2.3, which names another release."""
    if not isinstance(value, str):
        raise InputError(f"version {value!r} must be a quoted string, e.g. \"2.26.2\" (YAML reads 2.30 as 2.3)")
    return value


def nccl_release(text: str) -> Release:
    """The release the NCCL model takes for ``text`` (``NEWEST`` for ``unknown``). A release
    newer than ``NEWEST`` takes the newest figures the model follows (``by_release``).

    Raises:
        InputError: a malformed version, or one older than the model's figures cover.
    """
    release = parse_version(text)
    if release is None:
        return NEWEST
    if release < OLDEST:
        raise InputError(f"NCCL {text}: the model follows NCCL 2.19-2.30; older releases rate NVLS differently")
    return release


def newer_note(text: str) -> str | None:
    """What to say of a printed NCCL version newer than ``NEWEST``: the model times it by the
    newest figures it follows, which that release may have changed; None otherwise."""
    release = parse_version(text)
    if release is None or release <= NEWEST:
        return None
    return (f"NCCL {text} is newer than the releases the model follows (2.19-{release_text(NEWEST)}): "
            f"timed by {release_text(NEWEST)}'s figures")


def release_text(release: Release) -> str:
    """``2.26.2``, or ``2.27.x`` for the newest release of a series. A bound gives the newest
    release it allows (``<2.28.9``: ``2.28.8``), whether or not NVIDIA tagged that one."""
    major, minor, patch = release
    return f"{major}.{minor}.{'x' if patch == _ANY_PATCH else patch}"


def by_release(table: tuple[tuple[Release, _T], ...], release: Release) -> _T:
    """The figure of ``table`` ((first release carrying it, figure), oldest first) in ``release``."""
    value = table[0][1]
    for first, figure in table:
        if release >= first:
            value = figure
    return value
