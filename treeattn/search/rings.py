"""The ring ring attention runs on: one that follows the topology, as implementations lay it out.

A ring in rank order crosses every node boundary from the last GPU of one node to the first
of the next: on a rail-optimized fabric those are different rails, so each such hop climbs
to the spine, and flows that meet there share its links. Implementations lay rings along
rails and NVLink rings instead. Candidates:

* ``rank``: ranks in order (the topologies number ranks domain by domain);
* ``node-snake``: nodes in order, each node's ranks by rail, every other node reversed, so
  consecutive nodes meet on one rail (the ring closes on a rail when the node count is even);
* ``rail-snake``: rails in order, each rail's ranks node by node, every other rail reversed,
  so rails meet inside a node (closes inside a node when the rail count is even).

The pick is the candidate whose busiest link is least loaded: per link, the hops routed
over it over its bandwidth, maximised over links (every hop of ring attention moves a KV
block at the same time, so that link sets the round's time); ties keep the earlier name.
"""

from __future__ import annotations

from treeattn.search.candidates import Layout, layout_of
from treeattn.topology.model import Topology

__all__ = ["ring_candidates", "ring_order", "ring_load"]


def ring_candidates(lay: Layout) -> dict[str, list[int]]:
    """Named ring orders for ``lay`` (``rank`` always; the snakes where nodes have rails)."""
    out = {"rank": list(range(lay.p))}
    if len(lay.nodes) < 2 or not lay.rails:
        return out
    rail_of = {r: k for k, rail in enumerate(lay.rails) for r in rail}
    if len(rail_of) != lay.p:
        return out
    by_rail = [sorted(node, key=lambda r: (rail_of[r], r)) for node in lay.nodes]
    out["node-snake"] = [r for i, node in enumerate(by_rail) for r in (node if i % 2 == 0 else node[::-1])]
    rails = [sorted(rail, key=lambda r: (lay.node_of[r], r)) for rail in lay.rails]
    out["rail-snake"] = [r for k, rail in enumerate(rails) for r in (rail if k % 2 == 0 else rail[::-1])]
    return out


def ring_load(topo: Topology, order: list[int]) -> float:
    """The busiest link of a ring over ``order``: hops routed over it per GB/s of it."""
    p = len(order)
    if p < 2:
        return 0.0
    count: dict[int, int] = {}
    for i in range(p):
        for link in topo.route(order[i], order[(i + 1) % p]):
            count[link] = count.get(link, 0) + 1
    links = topo.links
    return max((n / links[i].bw_gbps for i, n in count.items() if links[i].bw_gbps > 0), default=0.0)


def ring_order(topo: Topology) -> tuple[str, list[int]]:
    """The ring ring attention should use on ``topo``: (candidate name, rank at each position).

    Examples:
        >>> from treeattn.topology.library import resolve
        >>> ring_order(resolve("dgx-h100"))[0]
        'rank'
    """
    cands = ring_candidates(layout_of(topo))
    best = min(cands, key=lambda name: (ring_load(topo, cands[name]), list(cands).index(name)))
    return best, cands[best]
