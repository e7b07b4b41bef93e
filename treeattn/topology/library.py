"""Where topologies come from: shipped files in ``topologies/``, family specs, or paths.

A name may end in a rank selection, ``NAME[ranks 0-3,8-11]``: the topology with only those
ranks placed, renumbered in the order given. ``treeattn plan --ranks`` writes such names
into plans, so a plan names the topology it was made for.

Examples:
    >>> from treeattn.topology.library import resolve
    >>> resolve("dgx-h100-2node").num_ranks
    16
    >>> resolve("dgx-h100:nodes=4").num_ranks
    32
    >>> resolve("dgx-h100-2node[ranks 0-3,8-11]").num_ranks
    8
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.metadata
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from treeattn.errors import InputError, TopologyError
from treeattn.textfile import special_file
from treeattn.topology.families import FAMILIES, build_family, parse_family_spec
from treeattn.topology.io import load_topology
from treeattn.topology.model import Topology
from treeattn.topology.schema import FieldError

__all__ = ["PresetInfo", "topologies_dir", "shipped_files", "resolve", "list_presets", "parse_ranks",
           "subset_topology", "recorded_source", "relocated_source", "relative_file_source", "resolve_recorded"]

ENV_DIR = "TREEATTN_TOPOLOGIES"
"""Environment variable naming another folder of shipped topology files."""


@dataclass(frozen=True, slots=True)
class PresetInfo:
    """One entry of ``treeattn topo list``."""

    name: str
    ranks: int
    description: str
    source: Literal["file", "family"]
    """``file``: a YAML file in topologies/; ``family``: a builder (``NAME:k=v`` for other sizes)."""
    keys: str = ""
    """A family's parameters with their defaults, ``k=v,k=v`` ("" for files)."""

    @property
    def listed(self) -> str:
        """The description with a family's spec appended, ``... [NAME:k=v,k=v]``."""
        return f"{self.description} [{self.name}:{self.keys}]" if self.keys else self.description

    def to_dict(self) -> dict:
        return {"name": self.name, "ranks": self.ranks, "description": self.listed, "source": self.source}


def topologies_dir() -> Path | None:
    """The folder of shipped files: ``$TREEATTN_TOPOLOGIES``, else ``topologies/`` at the
    root of the source tree this package was imported from (a checkout, an editable
    install), else where an installed wheel put them (``<prefix>/share/treeattn/topologies``,
    found through the distribution's record of its files)."""
    env = os.environ.get(ENV_DIR)
    if env:
        if not Path(env).expanduser().is_dir():  # else every shipped name would go unfound, unsaid why
            raise TopologyError(f"${ENV_DIR} is {env!r}, which is not a folder: it names the folder of shipped "
                                "topology files in place of treeattn's own; unset it or name a folder")
        return Path(env).expanduser()
    here = Path(__file__).resolve().parents[2] / "topologies"
    return here if here.is_dir() else _installed_dir()


def _installed_dir() -> Path | None:
    return installed_data_dir("topologies")


@functools.lru_cache(maxsize=4)
def installed_data_dir(folder: str) -> Path | None:
    """Where an installed wheel put ``<prefix>/share/treeattn/FOLDER`` (found through the
    distribution's record of its files), or None (not installed, or no such folder)."""
    try:
        files = importlib.metadata.files("treeattn") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.suffix == ".yaml" and f.parts[-4:-1] == ("share", "treeattn", folder):
            found = Path(f.locate()).resolve().parent
            if found.is_dir():
                return found
    return None


def shipped_files() -> dict[str, Path]:
    """Shipped topology files by name (file name without ``.yaml``), sorted."""
    d = topologies_dir()
    if d is None or not d.is_dir():
        return {}
    return {p.stem: p for p in sorted(d.glob("*.yaml"))}


def resolve(spec: str) -> Topology:
    """Turn what a user typed into a routable Topology.

    Args:
        spec: a path to a YAML file; a shipped name (``dgx-h100-16node``); a family spec
            ``NAME:key=value,...`` (``dgx-h100:nodes=2048``); or a family name alone
            (default parameters) when no shipped file has that name. Any of them may end
            in a rank selection ``[ranks 0-3,8-11]`` (see ``subset_topology``).

    Returns:
        The topology. Family members are cached (same spec, same object).
    """
    text = spec.strip()
    path = Path(text).expanduser()
    sub = _SUBSET.match(text)
    if sub is not None and not path.is_file():
        base = resolve(sub.group("base"))
        sel = sub.group("sel")
        return subset_topology(base, parse_ranks(sel, base.num_ranks, what=f"topology {spec!r}: ranks"),
                               sel.replace(" ", ""))
    if "[" in text and not path.is_file() and path.suffix not in (".yaml", ".yml"):
        # Otherwise the bracket is read as part of a family parameter or a name, and the error
        # blames that ('nodes must be an integer', 'unknown topology') rather than the selection.
        raise TopologyError(f"topology {spec!r}: cannot read its rank selection; write it as "
                            "NAME[ranks 0-3,8-11] (a space after 'ranks', the brackets closed)")
    name = text.partition(":")[0]
    if ":" in text and name in FAMILIES and not path.is_file():
        return _family(text)
    if _names_file(text):
        return load_topology(path)
    if not text.strip():  # Path('') is the current folder
        raise TopologyError(f"topology {spec!r} is empty; give a topology YAML file, a shipped name or a family "
                            "spec (treeattn topo list)")
    if path.is_dir():  # not 'unknown topology': the name is there, and is a folder
        raise TopologyError(f"topology {spec!r} is a folder; give a topology YAML file, a shipped name or a family "
                            "spec (treeattn topo list)")
    files = shipped_files()
    if text in files:
        return load_topology(files[text])
    if text in FAMILIES:
        return _family(text)
    known = sorted(set(files) | set(FAMILIES))
    hint = [k for k in known if k.lower() == name.lower()] or difflib.get_close_matches(name, known, n=1)
    # A family keeps the parameters (and ranks) the user gave; a shipped file takes none.
    extra = f" (did you mean {hint[0] + (text[len(name):] if hint[0] in FAMILIES else '')!r}?)" if hint else ""
    raise TopologyError(
        f"unknown topology {spec!r}{extra}; give a YAML file, a shipped name ({', '.join(files) or 'none found'}) "
        f"or a family spec NAME:key=value ({', '.join(sorted(FAMILIES))}); see `treeattn topo list`"
    )


def _names_file(text: str) -> bool:
    """Whether ``resolve`` reads ``text`` as a path (not a shipped name or family spec)."""
    path = Path(text).expanduser()
    if ":" in text and text.partition(":")[0] in FAMILIES and not path.is_file():
        return False
    return path.suffix in (".yaml", ".yml") or os.sep in text or path.is_file()


def _split_selection(spec: str) -> tuple[str, str]:
    """``("base", "[ranks 0-3]")`` for ``base[ranks 0-3]``; ``(spec, "")`` without a selection."""
    sub = _SUBSET.match(spec.strip())
    if sub is None or Path(spec.strip()).expanduser().is_file():
        return spec.strip(), ""
    return sub.group("base"), spec.strip()[len(sub.group("base")):]


def recorded_source(spec: str, topo: Topology, plan_path: Path | None = None) -> str | None:
    """What a plan written to ``plan_path`` records (``TopologyRef.source``) so that
    ``resolve_recorded`` finds ``topo`` again from any directory.

    Args:
        spec: what the user typed (``resolve``'s argument), with any ``[ranks ...]`` selection.
        topo: the topology it gave.
        plan_path: where the plan is written; None: not known yet (``relocated_source``
            makes the absolute path this gives relative once it is).

    Returns:
        None when the topology's name finds it (a shipped name, a family member); else
        ``spec``, a file's path made relative to the plan's folder (absolute when it cannot be,
        or without ``plan_path``).
    """
    base, selection = _split_selection(spec)
    if not _names_file(base):
        if spec.strip() == topo.name:
            return None
        try:  # a family member's name is its canonical spec: it finds it again
            if resolve(topo.name).fingerprint == topo.fingerprint:
                return None
        except InputError:
            pass
        return spec.strip()
    if special_file(Path(base).expanduser()):
        # A pipe (``-t <(cat my.yaml)``) is gone once read; its path would name /proc/PID/fd/pipe:[N].
        # The plan keeps the topology's name and fingerprint, and --topology finds it again.
        return None
    absolute = Path(base).expanduser().resolve().as_posix() + selection
    return absolute if plan_path is None else relocated_source(absolute, plan_path)


def relocated_source(source: str | None, plan_path: Path, base: str | None = None) -> str | None:
    """``source`` (``TopologyRef.source``) for a plan written to ``plan_path``: a file,
    named by its absolute path (``recorded_source`` without a plan path) or relative to the
    folder ``base`` (a loaded plan's ``TopologyRef.base``), relative to the plan's folder, so
    that the two can move together; anything else as it is."""
    if source is None:
        return None
    spec, selection = _split_selection(source)
    if not _names_file(spec) or not (Path(spec).is_absolute() or base is not None):
        return source
    if special_file(plan_path):
        # Written into a pipe or a terminal (-o /dev/stdout): the plan's folder is not known
        # (the pipe's would be /proc/PID/fd), so the file is named by its absolute path.
        return Path(os.path.normpath(Path(base or "/") / spec)).as_posix() + selection
    try:
        where = Path(os.path.relpath(Path(base or "/") / spec, Path(plan_path).resolve().parent)).as_posix()
    except ValueError:  # another drive
        return source
    # A bare file name without a .yaml suffix would read back as a topology name.
    return (where if "/" in where or Path(where).suffix in (".yaml", ".yml") else f"./{where}") + selection


def relative_file_source(source: str | None) -> bool:
    """Whether ``source`` (``TopologyRef.source``) names a topology file by a path relative
    to the plan's folder (not a name, a family spec or an absolute path)."""
    if source is None:
        return False
    spec, _ = _split_selection(source)
    return _names_file(spec) and not Path(spec).expanduser().is_absolute()


def resolve_recorded(name: str, fingerprint: str, source: str | None, plan_path: Path | None,
                     what: str = "the plan", ranks: int | None = None, option: str = "--topology ") -> Topology:
    """The topology a plan was made for, from what it records, with its fingerprint checked.

    Args:
        name: ``TopologyRef.name``. fingerprint: ``TopologyRef.fingerprint``.
        source: ``TopologyRef.source`` (a file relative to the plan's folder), or None.
        plan_path: the plan file (relative sources are read from its folder).
        what: how errors name the plan.
        ranks: the plan's rank count, named where the topology now places another.
        option: how the errors name the way to give a topology ("--topology ", the CLI's; the
            API's "topology=").

    Returns:
        The topology.

    Raises:
        InputError: it is not found, or it changed since; the message says what to pass.
    """
    made = f"{what} was made for topology {name!r} ({fingerprint})"
    base, selection = _split_selection(source if source is not None else name)
    from_file = source is not None and _names_file(base)
    if from_file and plan_path is not None and not Path(base).expanduser().is_absolute():
        # From the plan's real folder, as the source was written (a symlinked folder resolves).
        base = os.path.normpath(Path(plan_path).resolve().parent / base)
    spec = base + selection
    try:
        topo = resolve(spec)
    except InputError as exc:
        if source is None:
            why = "a name that is no shipped topology or family here, and the plan records no file"
        elif from_file and Path(base).expanduser().is_dir():
            why = f"from {base}, a folder, not a topology file"
        elif from_file and not Path(base).expanduser().is_file():
            why = f"from {base}, which does not exist"
        else:
            why = f"from {spec}: {exc}"
        raise InputError(f"{made}, {why}; pass {option}FILE|NAME with that topology") from None
    if topo.fingerprint != fingerprint and ranks is not None and topo.num_ranks != ranks:
        raise InputError(f"{made}, but {spec} places {topo.num_ranks} ranks now, not the plan's {ranks}; pass "
                         f"{option.strip()} with a topology of {ranks} ranks, or plan again")
    if topo.fingerprint != fingerprint:
        now = (f"{spec} is {topo.fingerprint} (the plan was made on another topology of that name, or "
               f"{spec} changed since)" if source is None else f"{spec} is {topo.fingerprint} now (it changed since)")
        shown = shlex.quote(spec) if option.startswith("--") else spec  # a flag's value, as a shell reads it
        raise InputError(f"{made}, but {now}; pass {option}{shown} to predict on it as it is, or plan again")
    return topo


@functools.lru_cache(maxsize=16)
def _family(spec: str) -> Topology:
    name, params = parse_family_spec(spec)
    try:
        topo = build_family(name, params)
        topo.check_routable()
    except FieldError as exc:
        raise TopologyError(f"topology {spec!r}: {exc.message}") from None
    except TopologyError as exc:
        raise TopologyError(f"topology {spec!r}: {exc}") from None
    return topo


def list_presets() -> list[PresetInfo]:
    """Every shipped file (loaded, to count its ranks) then every family at its defaults.

    Returns:
        Presets sorted by source (files first), then name.
    """
    out = []
    for name, path in shipped_files().items():
        topo = load_topology(path)
        out.append(PresetInfo(name, topo.num_ranks, topo.description, "file"))
    for name in sorted(FAMILIES):
        fam = FAMILIES[name]
        params = ",".join(f"{p.name}={p.default}" for p in fam.params)
        out.append(PresetInfo(name, build_family(name).num_ranks, fam.description, "family", params))
    return out


_SUBSET = re.compile(r"^(?P<base>.+)\[ranks (?P<sel>[^\[\]]+)\]$")
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_ranks(spec: str, num_ranks: int, *, what: str = "--ranks") -> tuple[int, ...]:
    """Read a rank selection: ``0-7``, ``0,2,4,6``, ``0-3,8-11``.

    Args:
        spec: comma-separated ranks and inclusive ranges.
        num_ranks: ranks the topology places; each named rank must be below it.
        what: how error messages name the selection (the flag or the topology spec).

    Returns:
        The ranks in the order given (no repeats).

    Raises:
        InputError: unreadable, backwards range, a rank out of range, or a repeat.
    """
    out: list[int] = []
    for part in str(spec).split(","):
        m = _RANGE.match(part)
        if not m:
            raise InputError(f"cannot read {what} {spec!r}: {part!r} is not a rank or a range like 0-7")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise InputError(f"{what} {spec!r}: range {part.strip()!r} runs backwards; write it low-high")
        if hi >= num_ranks:  # before the range is built: 0-99999999999999999999 overflows, 0-999999999 fills memory
            raise InputError(f"{what} {spec!r}: rank {max(lo, num_ranks)} does not exist; the topology places "
                             f"ranks 0-{num_ranks - 1}")
        out.extend(range(lo, hi + 1))
    seen: set[int] = set()
    for r in out:
        if r in seen:
            raise InputError(f"{what} {spec!r} names rank {r} twice")
        seen.add(r)
    return tuple(out)


def subset_topology(topo: Topology, ranks: tuple[int, ...], label: str | None = None) -> Topology:
    """The same machine with only ``ranks`` placed (renumbered 0..len-1 in the order given).

    Args:
        topo: the full topology.
        ranks: old rank numbers to keep.
        label: how the subset is written in the new name (default: the rank list).

    Returns:
        A Topology named ``NAME[ranks LABEL]`` (``resolve`` reads that name back); its
        fingerprint differs from the full one's. All ranks in order: ``topo`` itself.
    """
    if tuple(ranks) == tuple(range(topo.num_ranks)):
        return topo
    label = label if label is not None else ",".join(map(str, ranks))
    return dataclasses.replace(topo, name=f"{topo.name}[ranks {label}]", ranks=tuple(topo.ranks[r] for r in ranks))
