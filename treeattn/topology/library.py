"""Where topologies come from: shipped files in ``topologies/``, family specs, or paths.

Examples:
    >>> from treeattn.topology.library import resolve
    >>> resolve("dgx-h100-2node").num_ranks
    16
    >>> resolve("dgx-h100:nodes=4").num_ranks
    32
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from treeattn.errors import TopologyError
from treeattn.topology.families import FAMILIES, build_family, parse_family_spec
from treeattn.topology.io import load_topology
from treeattn.topology.model import Topology
from treeattn.topology.schema import FieldError

__all__ = ["PresetInfo", "topologies_dir", "shipped_files", "resolve", "list_presets"]

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

    def to_dict(self) -> dict:
        return {"name": self.name, "ranks": self.ranks, "description": self.description, "source": self.source}


def topologies_dir() -> Path | None:
    """The folder of shipped files: ``$TREEATTN_TOPOLOGIES``, else ``topologies/`` at the
    root of the source tree this package was imported from (editable installs too)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2] / "topologies"
    return here if here.is_dir() else None


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
            (default parameters) when no shipped file has that name.

    Returns:
        The topology. Family members are cached (same spec, same object).
    """
    text = spec.strip()
    path = Path(text).expanduser()
    name = text.partition(":")[0]
    if ":" in text and name in FAMILIES and not path.is_file():
        return _family(text)
    if path.suffix in (".yaml", ".yml") or os.sep in text or path.is_file():
        return load_topology(path)
    files = shipped_files()
    if text in files:
        return load_topology(files[text])
    if text in FAMILIES:
        return _family(text)
    known = sorted(set(files) | set(FAMILIES))
    hint = difflib.get_close_matches(name, known, n=1)
    extra = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise TopologyError(
        f"unknown topology {spec!r}{extra}; give a YAML file, a shipped name ({', '.join(files) or 'none found'}) "
        f"or a family spec NAME:key=value ({', '.join(sorted(FAMILIES))}); see `treeattn topo list`"
    )


@functools.lru_cache(maxsize=16)
def _family(spec: str) -> Topology:
    name, params = parse_family_spec(spec)
    try:
        topo = build_family(name, params)
        topo.check_routable()
    except FieldError as exc:
        what = f"{exc.loc[-1]} " if exc.loc[:1] == ("params",) else ""
        raise TopologyError(f"topology {spec!r}: {what}{exc.message}") from None
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
        desc = f"{fam.description} [{name}:{params}]" if params else fam.description
        out.append(PresetInfo(name, build_family(name).num_ranks, desc, "family"))
    return out
