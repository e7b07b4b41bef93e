"""The NCCL environment variables that restrict NCCL's pick, read as NCCL and RCCL read them.

``NCCL_ALGO`` and ``NCCL_PROTO`` (NCCL's list syntax: ``Ring,Tree``, ``^LL128``) and
``NCCL_NVLS_ENABLE=0`` restrict the algorithms and protocols ``treeattn.cost.nccl.pick`` may
choose (``allowed_by_env``); RCCL's MSCCL all-pairs all-reduce (``treeattn.cost.msccl``) is not
restricted by ``NCCL_ALGO``, and ``RCCL_MSCCL_ENABLE=0`` turns it off. ``NCCL_P2P_DISABLE``
and ``NCCL_P2P_LEVEL`` set the P2P level (``p2p_level_from_env``), a topology's
``cost.p2p_level``: which GPU pairs go through host memory. Other variables do not change
what the model predicts (``ENV_SETTINGS``).
"""

from __future__ import annotations

import re

from treeattn.cost.nccl_tuning import _NCCL_ALGOS, Algorithm, Protocol
from treeattn.errors import InputError
from treeattn.topology.model import P2P_LEVELS, p2p_level_name, p2p_level_names
from treeattn.topology.nccl_version import Release, release_text

__all__ = [
    "setting_meaning",
    "ENV_SETTINGS",
    "P2P_SETTINGS",
    "INT_SETTINGS",
    "allowed_by_env",
    "unread_numbers",
    "p2p_level_from_env",
    "msccl_single_process",
    "function_list",
]


def _env_list(value: str, names: tuple[str, ...], what: str) -> set[str]:
    """NCCL's list syntax (``Ring,Tree``, ``^LL128``), function prefixes left out: the
    names it enables, lower-case."""
    text = value.strip()
    if ";" in text or ":" in text:
        raise InputError(f"{what}={value!r}: per-function lists are not modelled; give one list for all")
    negate = text.startswith("^")
    items = {x.strip().lower() for x in text.lstrip("^").split(",") if x.strip()}
    known = {n.lower() for n in names}
    unmodelled = ("collnetdirect", "collnetchain", "pat") if "ring" in known else ()
    bad = sorted(items - known - set(unmodelled))
    if bad:
        also = f" and {', '.join(unmodelled)}, which the model does not time" if unmodelled else ""
        raise InputError(f"{what}={value!r}: unknown {bad[0]!r}; NCCL knows {', '.join(names)}{also}")
    return known - items if negate else items & known


def function_list(value: str, function: str) -> str | None:
    """The list an ``NCCL_ALGO`` / ``NCCL_PROTO`` value gives ``function`` (``allreduce``, ...),
    NCCL 2.24's per-function syntax read (``tree;allreduce:ring``, ``tuning.cc`` parseList): the
    function's own entry, else the entry that names none; None where neither is there."""
    plain = None
    for part in value.split(";"):
        name, colon, items = part.rpartition(":")
        if colon and name.strip().lower() == function:
            return items
        if not colon and plain is None:
            plain = part
    return plain


_NUMBER = re.compile(r"\s*([+-]?)(?:0[xX]([0-9a-fA-F]+)|(0[0-7]*)|([1-9]\d*))")
"""What ``strtoll(value, NULL, 0)`` reads: the leading number, hex after ``0x``, octal after ``0``."""


def _int_env(value: str | None, default: int) -> int:
    """An integer variable as NCCL's and RCCL's parameters read it (``src/misc/param.cc``
    ``ncclLoadParam``: ``strtoll(value, NULL, 0)``, the leading number, else 0; unset, empty
    or out of int64's range: the default)."""
    if value is None or value == "":
        return default
    m = _NUMBER.match(str(value))
    if not m:
        return 0
    sign, hexa, octal, decimal = m.groups()
    n = int(hexa, 16) if hexa else int(octal, 8) if octal else int(decimal)
    n = -n if sign == "-" else n
    return n if -2**63 <= n < 2**63 else default  # strtoll's ERANGE: NCCL keeps the default


INT_SETTINGS = {"NCCL_NVLS_ENABLE": 2, "RCCL_MSCCL_ENABLE": 1, "RCCL_MSCCL_ENABLE_SINGLE_PROCESS": 1,
                "NCCL_P2P_DISABLE": 0}
"""The integer variables of ``ENV_SETTINGS`` and NCCL's (RCCL's) default of each."""


def _setting(env: dict[str, str], name: str) -> int:
    """An integer setting of ``INT_SETTINGS`` as NCCL reads it (``_int_env``)."""
    return _int_env(env.get(name), INT_SETTINGS[name])


def unread_numbers(env: dict[str, str] | None) -> list[str]:
    """One line for each integer setting (``INT_SETTINGS``) whose value is not wholly a number:
    NCCL reads its leading number, or 0 without one (``NCCL_P2P_DISABLE=x`` is 0), and says
    nothing (only ``NCCL_DEBUG=INFO`` shows the value it took; an out-of-range number it
    leaves for its default), as the model reads it (``_int_env``)."""
    out = []
    for name, default in INT_SETTINGS.items():
        value = (env or {}).get(name)
        if value is None or value == "":
            continue
        m = _NUMBER.match(value)
        n = _int_env(value, default)
        if m is None or m.end() != len(value):
            out.append(f"{name}={value!r} is not a number: NCCL reads it as {n} without a word, and so does the model")
        elif _int_env(value, default + 1) != n:  # the default came back: out of range
            out.append(f"{name}={value!r} is out of range: NCCL keeps its default, {default}, and so does the model")
    return out


P2P_SETTINGS = ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL")
"""The environment variables ``p2p_level_from_env`` reads: the ones the point-to-point model reads."""

ENV_SETTINGS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "RCCL_MSCCL_ENABLE", "RCCL_MSCCL_ENABLE_SINGLE_PROCESS",
                *P2P_SETTINGS)
"""The environment variables ``allowed_by_env`` and ``p2p_level_from_env`` read: the only ones
that change the model's prediction."""

_OLD_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")
"""``NCCL_P2P_LEVEL``'s old numbering, 0-5 (``paths.cc`` ``levelsOldToNew``)."""


def msccl_single_process(env: dict[str, str] | None) -> bool:
    """Whether ``RCCL_MSCCL_ENABLE_SINGLE_PROCESS`` (RCCL 2.21 and later; default 1) lets MSCCL
    run where one process drives several ranks (``treeattn.cost.msccl.single_process_blocks``)."""
    return _setting(env or {}, "RCCL_MSCCL_ENABLE_SINGLE_PROCESS") != 0


_RCCL_NAMES = ("LOC", "XGMI", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS")
"""The level names RCCL's ``NCCL_P2P_LEVEL`` reads (its ``topoPathTypeStr`` up to SYS,
``src/graph/topo.cc``, the AMD build, tags rocm-6.1.2 and rocm-6.2.2): NCCL's NVL is XGMI,
and there is no C2C or P2C."""

_NCCL_NAME_FROM: dict[str, Release] = {"C2C": (2, 26, 2), "P2C": (2, 27, 3)}
"""NCCL's level names added after 2.18, by the first release whose ``topoPathTypeStr`` has
them (NVIDIA/nccl tags v2.26.2-1 and v2.27.3-1; v2.25.1-1 has neither)."""


def _names_read(library: str, release: Release | None) -> tuple[str, ...] | None:
    """The level names ``library`` at ``release`` (None: the newest) reads; None for a library
    not known (either's names)."""
    if library == "RCCL":
        return _RCCL_NAMES
    if library == "NCCL":
        return tuple(n for n in P2P_LEVELS if release is None or release >= _NCCL_NAME_FROM.get(n, release))
    return None


def p2p_level_from_env(env: dict[str, str] | None, library: str = "", release: Release | None = None) -> str | None:
    """The P2P level (``P2P_LEVELS``) an NCCL environment sets, as NCCL's ``ncclGetLevel``
    reads it (``src/graph/paths.cc``): ``NCCL_P2P_DISABLE=1`` gives LOC (no peer-to-peer, NVLink
    included); else ``NCCL_P2P_LEVEL``, a path type's name (``PHB``) or an old number (0 LOC,
    1 PIX, 2 PXB, 3 PHB, 4 and up SYS). RCCL names the GPU-fabric hop ``XGMI`` where NCCL says
    ``NVL`` (``src/graph/topo.cc`` ``topoPathTypeStr``): read as NVL. None: neither sets it
    (NCCL's default applies). ``library`` (``NCCL``, ``RCCL``; empty: either) and, for NCCL,
    ``release`` (None: the newest) hold the names to those it reads (``_names_read``): NCCL
    does not read XGMI, nor RCCL NVL, nor NCCL before 2.26.2 C2C.

    Raises:
        InputError: an ``NCCL_P2P_LEVEL`` the library would not read (it would ignore it).
    """
    env = env or {}
    if _setting(env, "NCCL_P2P_DISABLE") == 1:
        return "LOC"
    text = env.get("NCCL_P2P_LEVEL")
    if text is None:
        return None
    if (level := p2p_level_name(text)) is not None:  # RCCL's XGMI as NVL
        names = _names_read(library, release)
        if names is not None and text not in names:
            which = f"{library} {release_text(release)}" if release is not None and library == "NCCL" else library
            raise InputError(f"NCCL_P2P_LEVEL={text!r}: {which} reads {', '.join(names)} or a number, not this "
                             "name; it would ignore the setting")
        return level
    if text[:1].isascii() and text[:1].isdigit():  # NCCL: str[0] in 0-9
        return _OLD_LEVELS[min(_int_env(text, 0), len(_OLD_LEVELS) - 1)]
    raise InputError(f"NCCL_P2P_LEVEL={text!r}: NCCL reads {p2p_level_names()}, in capitals, or 0-5")


def allowed_by_env(env: dict[str, str] | None) -> tuple[set[str], set[str]]:
    """The algorithms and protocols an NCCL environment leaves enabled (lower-case names).

    Reads ``NCCL_ALGO`` and ``NCCL_PROTO`` (NCCL's list syntax), ``NCCL_NVLS_ENABLE`` and
    ``RCCL_MSCCL_ENABLE`` (integers, as NCCL and RCCL read them: 0 turns NVLS or MSCCL off);
    other variables do not change what this model picks.
    """
    env = env or {}
    algos = {a.value for a in _NCCL_ALGOS}
    protos = {p.value.lower() for p in Protocol}
    if "NCCL_ALGO" in env:
        algos = _env_list(env["NCCL_ALGO"], tuple(a.value for a in _NCCL_ALGOS), "NCCL_ALGO")
    if "NCCL_PROTO" in env:
        protos = _env_list(env["NCCL_PROTO"], tuple(p.value for p in Protocol), "NCCL_PROTO")
    if _setting(env, "NCCL_NVLS_ENABLE") == 0:  # NCCL: 0, "00", "false" alike turn NVLS off
        algos -= {"nvls", "nvlstree"}
    # RCCL's MSCCL runs ahead of its tuner, whatever NCCL_ALGO and NCCL_PROTO say; its own
    # switch turns it off (msccl_lifecycle.cc: RCCL_MSCCL_ENABLE).
    if _setting(env, "RCCL_MSCCL_ENABLE") != 0:
        algos.add(Algorithm.ALLPAIRS.value)
    return algos, protos


def setting_meaning(name: str, value: str) -> tuple:
    """What one setting tells the model (NCCL reads algorithm and protocol names in any case,
    integers by their leading number): two values of one meaning agree."""
    env = {name: value}
    algos, protos = allowed_by_env(env)
    return sorted(algos), sorted(protos), p2p_level_from_env(env), msccl_single_process(env)
