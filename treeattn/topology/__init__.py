"""Topology model: devices, links, rank placement and routing."""

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

__all__ = [
    "CostParams",
    "Device",
    "DeviceKind",
    "Link",
    "LinkClass",
    "LinkKind",
    "Topology",
    "link_class",
]
