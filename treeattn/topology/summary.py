"""What ``treeattn topo show`` reports about a topology, as plain data (JSON-ready)."""

from __future__ import annotations

from collections import Counter

from treeattn.topology.domains import DomainKind, DomainLevel, domains, rails
from treeattn.topology.model import Topology
from treeattn.topology.network import leaf_spans, network_summary, nic_sharing

__all__ = ["topology_summary", "route_matrix"]


def _num(x: float) -> float | None:
    """JSON has no infinity: a rank's route to itself is reported as null."""
    return None if x == float("inf") else round(x, 6)


def route_matrix(topo: Topology) -> list[list[float | None]]:
    """Bottleneck bandwidth (GB/s) of the route from rank i (row) to rank j (column);
    None on the diagonal."""
    n = topo.num_ranks
    return [[_num(topo.route_bw_gbps(i, j)) for j in range(n)] for i in range(n)]


def topology_summary(topo: Topology, matrix_limit: int = 16) -> dict:
    """Counts, link kinds, domains and the routes from rank 0 to every rank.

    Args:
        topo: the topology.
        matrix_limit: include the rank x rank bandwidth matrix up to this many ranks.

    Returns:
        Plain data with sorted keys when dumped: ``name``, ``fingerprint``, ``ranks``,
        ``nodes``, ``devices`` (count per kind), ``links`` (per kind: directed link count
        and distinct bandwidths and latencies; where calibration kept the links' hardware
        ratings, also the distinct ``rated_gbps`` and ``rated_latency_us`` NCCL's collective
        model reads, ``Topology.rated``: on GPU ranks only, as on host ranks gloo's
        collectives read the measured rates and nothing reads the ratings), ``cost`` (the
        YAML ``cost:`` mapping, every term set),
        ``domains`` (per level: ``kind``, ``groups``, ``sizes``; the ``leaf`` level also
        ``leaves``, how many leaf switches a group spans), ``rails``, ``network``
        (``treeattn.topology.network.network_summary``, None without switches), ``nics``
        (``nic_sharing``: how many ranks send through each NIC; None without networked NICs),
        ``from_rank0`` (per rank: device, ``bw_gbps``, ``latency_us``, ``hops``) and, for
        small topologies, ``bw_matrix_gbps`` (``bw_gbps`` is a route's narrowest link as the
        file rates it; ``treeattn.cost.nccl_rates.pair_rate_gbps`` is what a transfer moves).
    """
    kinds = Counter(d.kind.value for d in topo.devices)
    links: dict[str, dict] = {}
    # On host ranks the collectives run on gloo at the measured rates (cost.library,
    # cost.bounds): a hand-written file's ratings there are read by no prediction.
    rated = topo if topo.on_hosts else topo.rated
    keys = ("bw_gbps", "latency_us") + (() if rated is topo else ("rated_gbps", "rated_latency_us"))
    for ln, hw in zip(topo.links, rated.links, strict=True):
        entry = links.setdefault(ln.kind.value, {"count": 0, **{k: set() for k in keys}})
        entry["count"] += 1
        entry["bw_gbps"].add(ln.bw_gbps)
        entry["latency_us"].add(ln.latency_us)
        if rated is not topo:
            entry["rated_gbps"].add(hw.bw_gbps)
            entry["rated_latency_us"].add(hw.latency_us)
    for entry in links.values():
        for k in keys:
            entry[k] = sorted(entry[k])
    from_rank0 = []
    for r in range(topo.num_ranks):
        route = topo.route(0, r)
        from_rank0.append({
            "rank": r,
            "device": topo.ranks[r],
            "bw_gbps": _num(topo.route_bw_gbps(0, r)),
            "latency_us": round(topo.route_latency_us(0, r), 6),
            "hops": len(route),
        })
    out = {
        "name": topo.name,
        "description": topo.description,
        "fingerprint": topo.fingerprint,
        "sources": list(topo.sources),
        "ranks": topo.num_ranks,
        "nodes": len({topo.rank_device(r).node for r in range(topo.num_ranks)}),
        "devices": dict(sorted(kinds.items())),
        "links": dict(sorted(links.items())),
        "cost": topo.cost.to_dict(),
        "domains": [_domain(topo, lv) for lv in domains(topo)],
        "rails": len(rails(topo)),
        "network": network_summary(topo),
        "nics": nic_sharing(topo),
        "from_rank0": from_rank0,
    }
    if topo.num_ranks <= matrix_limit:
        out["bw_matrix_gbps"] = route_matrix(topo)
    return out


def _domain(topo: Topology, level: DomainLevel) -> dict:
    out = {"kind": level.kind.value, "groups": len(level.groups), "sizes": sorted({len(g) for g in level.groups})}
    if level.kind is DomainKind.LEAF:
        out["leaves"] = leaf_spans(topo, level)
    return out
