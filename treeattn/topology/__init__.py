"""Topology model: devices, links, rank placement and routing; files, families and presets.

Entry points: ``resolve(spec)`` (a shipped name, ``family:k=v`` or a YAML path),
``load_topology(path)``, ``dump_topology(topo)``, ``build_family(name, params)``,
``domains(topo)``, ``rank_nic(topo, rank)``, ``rails(topo)``.
"""

from treeattn.topology.domains import DomainKind, DomainLevel, domains, rails, rank_nic
from treeattn.topology.families import FAMILIES, build_family
from treeattn.topology.io import dump_topology, load_topology, load_topology_text, topology_json_schema
from treeattn.topology.library import PresetInfo, list_presets, resolve
from treeattn.topology.model import (
    CostParams,
    Device,
    DeviceKind,
    Link,
    LinkClass,
    LinkKind,
    Topology,
    link_class,
)

load = load_topology

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
