"""What the network between nodes is, for ``treeattn topo show``: its switches, its rails,
and which NIC carries each rank's network traffic.

A *leaf* is a network switch with a link to a NIC (or to a host that is its own NIC);
every other network switch sits above the leaves, named by its ``tier`` (``spine`` when
the file gives none). The fabric is *rail-optimized* when there are several rails (a NIC's
rail is its index among its node's NICs, as ``domains.rails``) and every leaf holds NICs of
one rail only: network traffic between rails then crosses the switches above the leaves.
"""

from __future__ import annotations

from collections import Counter

from treeattn.topology.domains import DomainLevel, nic_positions
from treeattn.topology.model import DeviceKind, LinkClass, Topology

__all__ = ["leaves_of", "network_summary", "nic_sharing", "idle_nic_note", "leaf_spans"]


def leaves_of(topo: Topology) -> dict[str, list[str]]:
    """Each leaf switch and the devices below it (NICs, networked hosts), sorted by name."""
    kind = {d.name: d.kind for d in topo.devices}
    below: dict[str, set[str]] = {}
    for ln in topo.links:
        if ln.cls is not LinkClass.NETWORK or ln.src == ln.dst:
            continue
        for sw, end in ((ln.src, ln.dst), (ln.dst, ln.src)):
            if kind[sw] is DeviceKind.SWITCH and kind[end] is not DeviceKind.SWITCH:
                below.setdefault(sw, set()).add(end)
    return {sw: sorted(ends) for sw, ends in sorted(below.items())}


def network_summary(topo: Topology) -> dict | None:
    """The switch fabric as plain data, or None without network switches.

    Returns:
        ``switches`` (count per tier: ``leaf``, then the tiers above), ``per_leaf`` (the
        distinct counts of devices below a leaf), ``below`` (their kinds), ``rails`` (how
        many NIC indices the leaves hold), ``rail_optimized`` and ``oversubscription`` (the
        least and greatest of a leaf's bandwidth down to its devices over its bandwidth up
        to the switches above, at least 1: non-blocking; None where no leaf has uplinks).
    """
    switches = [d for d in topo.devices if d.kind is DeviceKind.SWITCH]
    if not switches:
        return None
    leaves = leaves_of(topo)
    above = Counter(d.tier or "spine" for d in switches if d.name not in leaves)
    position = nic_positions(topo)
    rails_of = [{position.get(end) for end in ends} for ends in leaves.values()]
    used = set().union(*rails_of) if rails_of else set()
    kind = {d.name: d.kind.value for d in topo.devices}
    return {
        "switches": {"leaf": len(leaves), **dict(sorted(above.items()))},
        "per_leaf": sorted({len(ends) for ends in leaves.values()}),
        "below": sorted({kind[end] for ends in leaves.values() for end in ends}),
        "rails": len(used - {None}),
        "rail_optimized": None not in used and len(used) > 1 and all(len(r) == 1 for r in rails_of),
        "oversubscription": _oversubscription(topo, set(leaves)),
    }


def _oversubscription(topo: Topology, leaves: set[str]) -> list[float] | None:
    """[least, greatest] over the leaves with uplinks of down / up bandwidth (``network_summary``)."""
    kind = {d.name: d.kind for d in topo.devices}
    down: Counter = Counter()
    up: Counter = Counter()
    for ln in topo.links:
        if ln.src in leaves and ln.cls is LinkClass.NETWORK and ln.src != ln.dst:
            (up if kind[ln.dst] is DeviceKind.SWITCH else down)[ln.src] += ln.bw_gbps * ln.count
    # a leaf with more up than down is non-blocking: 1, not a fraction beside others' ratios
    ratios = sorted(max(1.0, round(down[leaf] / up[leaf], 2)) for leaf in leaves if up[leaf] > 0)
    return [ratios[0], ratios[-1]] if ratios else None


def nic_sharing(topo: Topology) -> dict | None:
    """How the ranks' network traffic spreads over the NICs that have network links, or
    None when no NIC has one. Each rank's traffic leaves through one NIC (its device's
    ``nic``, else the nearest over PCIe; ``routing``).

    Returns:
        ``nics`` (how many), ``ranks_per_nic`` ({ranks through one NIC: NICs}, as text keys
        for JSON, idle NICs under ``"0"``) and ``idle`` (names of the NICs no rank uses).
    """
    idx = topo._index
    networked = [d.name for d in topo.devices
                 if d.kind is DeviceKind.NIC and any(topo.links[i].cls is LinkClass.NETWORK for i in idx.out[d.name])]
    if not networked:
        return None
    load = Counter(idx.nic_of(topo.rank_device(r)) for r in range(topo.num_ranks))
    per = Counter(load.get(n, 0) for n in networked)
    return {
        "nics": len(networked),
        "ranks_per_nic": {str(k): per[k] for k in sorted(per)},
        "idle": [n for n in networked if not load.get(n)],
    }


def idle_nic_note(topo: Topology) -> str | None:
    """A warning where NICs on the network carry no rank's traffic while another carries two or
    more ranks' (``nic_sharing``): in an explicit file whose NICs hang off a CPU, as near to
    every GPU as each other, the nearest is the first, and every rank of the node shares it
    (a 2 x 8 H100 all-reduce at 69 GB/s of bus bandwidth instead of 441); None where not."""
    sharing = nic_sharing(topo)
    if sharing is None or not sharing["idle"]:
        return None
    # Only the nearest-NIC rule crowds ranks unasked: a NIC whose ranks all name it was chosen
    # (beside a storage NIC on its own switch, say); one that also carries a rank the rule put
    # there, beside another, may be the mistake.
    idx = topo._index
    devices = [topo.rank_device(r) for r in range(topo.num_ranks)]
    load = Counter(idx.nic_of(dev) for dev in devices)
    if not any(load[idx.nic_of(dev)] >= 2 for dev in devices if not dev.nic):
        return None
    idle = sharing["idle"]
    busy = sharing["nics"] - len(idle)
    shown = ", ".join(idle[:3]) + (f" and {len(idle) - 3} more" if len(idle) > 3 else "")
    return (f"{topo.name}: {topo.num_ranks} ranks send over the network through {busy} NIC(s) while {len(idle)} "
            f"carry none ({shown}): a rank's traffic leaves through its device's nic, else the nearest NIC over "
            "PCIe, the first of those as near; give each GPU its nic (explicit form: a device's nic field) to "
            "spread them")


def leaf_spans(topo: Topology, level: DomainLevel) -> list[int]:
    """For the ``leaf`` level of ``domains``, the distinct numbers of leaf switches a
    group's ranks reach their network through (1: the group shares one leaf)."""
    idx = topo._index
    leaves = leaves_of(topo)
    spans = set()
    for group in level.groups:
        seen: set[str] = set()
        for r in group:
            nic = idx.nic_of(topo.rank_device(r))
            seen.update(n for n in ([] if nic is None else idx.network_neighbors(nic)) if n in leaves)
        spans.add(len(seen))
    return sorted(spans)
