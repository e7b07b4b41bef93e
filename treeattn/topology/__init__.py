"""Topology model: devices, links, rank placement and routing; files, families and presets.

Entry points: ``resolve(spec)`` (a shipped name, ``family:k=v`` or a YAML path),
``load_topology(path)``, ``dump_topology(topo)``, ``build_family(name, params)``,
``domains(topo)``, ``rank_nic(topo, rank)``, ``rails(topo)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from treeattn.lazy import lazy_exports

# Eager: ``domains`` is a module of this package as well as the function exported here.
from treeattn.topology.domains import DomainKind, DomainLevel, domains, rails, rank_nic

# The others on first use: a rank process needs ``model`` without the YAML schema and families.
__getattr__, __dir__ = lazy_exports(__name__, {
    "families": ("FAMILIES", "build_family"),
    "io": ("dump_topology", "load_topology", "load_topology_text", "topology_json_schema"),
    "library": ("PresetInfo", "list_presets", "resolve"),
    "model": ("CostParams", "Device", "DeviceKind", "Link", "LinkClass", "LinkKind", "Topology", "link_class"),
})


if TYPE_CHECKING:
    from pathlib import Path

    from treeattn.topology.model import Topology


def load(path: str | Path) -> Topology:
    """``load_topology`` under a shorter name."""
    from treeattn.topology.io import load_topology

    return load_topology(path)


__all__ = [
    "CostParams",
    "Device",
    "DeviceKind",
    "DomainKind",
    "DomainLevel",
    "FAMILIES",
    "Link",
    "LinkClass",
    "LinkKind",
    "PresetInfo",
    "Topology",
    "build_family",
    "domains",
    "dump_topology",
    "link_class",
    "list_presets",
    "load",
    "load_topology",
    "load_topology_text",
    "rails",
    "rank_nic",
    "resolve",
    "topology_json_schema",
]
