"""Nested groupings of ranks, fastest first, for hierarchical planners.

Levels, in order: ``device`` (ranks sharing one host), ``fabric`` (NVLink/xGMI island:
GPUs joined by GPU-fabric links, directly or through NVSwitches), ``pcie-switch`` (same
first PCIe switch above the device), ``socket`` (same nearest CPU), ``node`` (same
machine), ``leaf`` (NICs on a common leaf switch). Each level merges the groups of the
levels before it with its own relation, so the groups nest (a GB200 NVL72 rack is one
``fabric`` group although it spans 18 nodes; in a rail-optimized fabric a ``leaf`` group
is the set of nodes whose NICs share leaves, a scalable unit). Levels whose grouping
equals the previous one, or that leave every rank alone, are dropped; the whole topology
is the implied top. Groups are sorted by their first rank; ranks inside a group ascend.

``rails`` is the cross-cutting view: ranks whose NIC has the same index in its node.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from treeattn.topology.model import DeviceKind, Topology

__all__ = ["DomainKind", "DomainLevel", "domains", "nic_positions", "rank_nic", "rails"]


class DomainKind(StrEnum):
    """Levels of ``domains``, fastest first."""

    DEVICE = "device"
    FABRIC = "fabric"
    PCIE_SWITCH = "pcie-switch"
    SOCKET = "socket"
    NODE = "node"
    LEAF = "leaf"


@dataclass(frozen=True, slots=True)
class DomainLevel:
    """One level: a partition of all ranks into groups."""

    kind: DomainKind
    groups: tuple[tuple[int, ...], ...]

    def group_of(self, rank: int) -> int:
        """Index in ``groups`` of the group holding ``rank``."""
        for i, g in enumerate(self.groups):
            if rank in g:
                return i
        raise KeyError(rank)

    def to_dict(self) -> dict:
        return {"kind": self.kind.value, "groups": [list(g) for g in self.groups]}


def _keys(topo: Topology, kind: DomainKind) -> list[object]:
    """Per rank, the key of its group at this level on its own (None: alone)."""
    idx = topo._index
    out: list[object] = []
    for name in topo.ranks:
        dev = idx.by_name[name]
        if kind is DomainKind.DEVICE:
            out.append(name)
        elif kind is DomainKind.FABRIC:
            isl = idx.island(name)
            out.append(("island", isl) if isl >= 0 else None)
        elif kind is DomainKind.PCIE_SWITCH:
            out.append(idx.nearest(name, DeviceKind.PCIE_SWITCH, through=frozenset()))
        elif kind is DomainKind.SOCKET:
            out.append(idx.nearest(name, DeviceKind.CPU))
        elif kind is DomainKind.NODE:
            out.append(("node", dev.node) if dev.node >= 0 else None)
        else:
            nic = idx.nic_of(dev)
            leaves = [] if nic is None else [n for n in idx.network_neighbors(nic)
                                             if idx.by_name[n].kind is DeviceKind.SWITCH]
            out.append(tuple(leaves) or None)
    return out


def domains(topo: Topology) -> list[DomainLevel]:
    """Nested rank groupings from the fastest domain to the slowest (see module doc).

    Args:
        topo: any topology.

    Returns:
        The levels that group something, fastest first.

    Examples:
        >>> from treeattn.topology.library import resolve
        >>> [(lv.kind.value, len(lv.groups)) for lv in domains(resolve("rtx4090:gpus=8"))]
        [('pcie-switch', 2), ('node', 1)]
    """
    n = topo.num_ranks
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    levels: list[DomainLevel] = []
    previous: tuple[tuple[int, ...], ...] | None = None
    for kind in DomainKind:
        keys = _keys(topo, kind)
        first: dict[object, int] = {}
        for r, key in enumerate(keys):
            if key is None:
                continue
            # Leaf keys are tuples of leaves: ranks sharing any leaf are joined.
            for k in (key if kind is DomainKind.LEAF else (key,)):
                if k in first:
                    a, b = find(first[k]), find(r)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
                else:
                    first[k] = r
        groups: dict[int, list[int]] = {}
        for r in range(n):
            groups.setdefault(find(r), []).append(r)
        part = tuple(tuple(g) for g in sorted(groups.values()))
        if part != previous and any(len(g) > 1 for g in part):
            levels.append(DomainLevel(kind, part))
        previous = part
    return levels


def rank_nic(topo: Topology, rank: int) -> str | None:
    """Name of the NIC carrying ``rank``'s cross-node traffic (its device's ``nic``, else
    the nearest one over PCIe; a host with its own network links is its own NIC), or None
    when it has none."""
    topo._check_rank(rank)
    return topo._index.nic_of(topo.rank_device(rank))


def nic_positions(topo: Topology) -> dict[str, int]:
    """Each NIC's rail: its index among its node's NICs, in device order."""
    position: dict[str, int] = {}
    per_node: dict[int, int] = {}
    for d in topo.devices:
        if d.kind is DeviceKind.NIC:
            position[d.name] = per_node.get(d.node, 0)
            per_node[d.node] = position[d.name] + 1
    return position


def rails(topo: Topology) -> tuple[tuple[int, ...], ...]:
    """Ranks grouped by rail: ``rails(t)[k]`` are the ranks whose NIC is the k-th NIC (in
    device order) of its node. Ranks without a NIC are left out; ``()`` when none has one.

    Args:
        topo: any topology.

    Returns:
        One tuple of ascending ranks per rail index.
    """
    position = nic_positions(topo)
    by_rail: dict[int, list[int]] = {}
    for r in range(topo.num_ranks):
        nic = rank_nic(topo, r)
        if nic in position:
            by_rail.setdefault(position[nic], []).append(r)
    return tuple(tuple(by_rail[k]) for k in sorted(by_rail))
