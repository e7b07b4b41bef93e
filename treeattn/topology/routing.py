"""Routing between devices (DESIGN.md section 4), cached so that fabrics of 16,000 GPUs
route in well under a second per thousand pairs.

A route is a tuple of indices into ``Topology.links``. Rules, in order:

1. Two ranks on one host: its loopback self-link.
2. Two GPUs joined by NVLink/xGMI, directly or through NVSwitches only (never through
   another GPU): that fabric, fewest hops first, widest first among equals.
3. Inside one machine: PCIe and socket links, through bridges and CPUs only; the shortest
   such path passes the lowest common bridge. A GPU without peer-to-peer bounces through
   host memory: up to its CPU, then down to the peer.
4. Otherwise through the network: each end reaches its NIC (the device's ``nic`` or the
   nearest one over PCIe), then the switch fabric; among equal-length switch paths one is
   picked by a hash of the two NICs (static ECMP), so flows spread over spines.
"""

from __future__ import annotations

import zlib
from collections import deque
from typing import TYPE_CHECKING

import networkx as nx

from treeattn.errors import TopologyError
from treeattn.topology.model import DeviceKind, LinkClass

if TYPE_CHECKING:
    from treeattn.topology.model import Device, Topology

__all__ = ["RouteIndex"]

_FABRIC_VIA = frozenset({DeviceKind.NVSWITCH})
_PCIE_VIA = frozenset({DeviceKind.PCIE_SWITCH, DeviceKind.CPU})


class RouteIndex:
    """Adjacency and route caches of one Topology (built lazily, once)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.by_name: dict[str, Device] = {d.name: d for d in topo.devices}
        self.link_id: dict[tuple[str, str], int] = {}
        self.out: dict[str, list[int]] = {d.name: [] for d in topo.devices}
        for i, ln in enumerate(topo.links):
            self.link_id[(ln.src, ln.dst)] = i
            if ln.src != ln.dst:
                self.out[ln.src].append(i)
        links = topo.links
        for ids in self.out.values():
            # Deterministic exploration: widest link first, then by peer name.
            ids.sort(key=lambda i: (-links[i].bw_gbps, links[i].dst))
        self._routes: dict[tuple[str, str], tuple[int, ...]] = {}
        self._nic: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._switch_paths: dict[tuple[str, str], list[list[str]]] = {}
        self._switch_graph: nx.DiGraph | None = None
        self._in: dict[str, list[str]] | None = None

    # -- public ---------------------------------------------------------------------------

    def device_route(self, a: str, b: str) -> tuple[int, ...]:
        key = (a, b)
        hit = self._routes.get(key)
        if hit is None:
            hit = self._compute(a, b)
            self._routes[key] = hit
        return hit

    # -- rules ------------------------------------------------------------------------------

    def _compute(self, a: str, b: str) -> tuple[int, ...]:
        da, db = self.by_name[a], self.by_name[b]
        if a == b:
            i = self.link_id.get((a, a))
            if i is None:
                raise TopologyError(
                    f"topology {self.topo.name!r}: two ranks share device {a!r} but it has no "
                    "loopback link; add a link with kind loopback from it to itself"
                )
            return (i,)
        if da.kind is DeviceKind.GPU and db.kind is DeviceKind.GPU:
            path = self._bfs(a, b, LinkClass.GPU_FABRIC, _FABRIC_VIA)
            if path is not None:
                return path
        if da.node == db.node and da.node >= 0:
            path = self._pcie_route(da, db)
            if path is not None:
                return path
        return self._network_route(da, db)

    def _pcie_route(self, da: Device, db: Device) -> tuple[int, ...] | None:
        bounce = (da.kind is DeviceKind.GPU and not da.p2p) or (
            db.kind is DeviceKind.GPU and not db.p2p
        )
        if not bounce:
            return self._bfs(da.name, db.name, LinkClass.PCIE, _PCIE_VIA)
        cpu = self._nearest(da.name, DeviceKind.CPU)
        if cpu is None:
            return None
        up = self._bfs(da.name, cpu, LinkClass.PCIE, _PCIE_VIA)
        down = self._bfs(cpu, db.name, LinkClass.PCIE, _PCIE_VIA)
        if up is None or down is None:
            return None
        return up + down

    def _network_route(self, da: Device, db: Device) -> tuple[int, ...]:
        nic_a, up = self._endpoint(da, outbound=True)
        nic_b, down = self._endpoint(db, outbound=False)
        if nic_a == nic_b:
            middle: tuple[int, ...] = ()
        else:
            middle = self._fabric_path(nic_a, nic_b)
        return up + middle + down

    # -- network pieces -----------------------------------------------------------------------

    def _has_network(self, name: str) -> bool:
        links = self.topo.links
        return any(links[i].cls is LinkClass.NETWORK for i in self.out[name])

    def _endpoint(self, dev: Device, outbound: bool) -> tuple[str, tuple[int, ...]]:
        """The NIC carrying ``dev``'s network traffic and the PCIe path to (or from) it."""
        if self._has_network(dev.name):
            return dev.name, ()
        hit = self._nic.get(dev.name)
        if hit is None:
            nic = dev.nic or self._nearest(dev.name, DeviceKind.NIC)
            if nic is None or nic not in self.by_name:
                raise TopologyError(
                    f"topology {self.topo.name!r}: {dev.name!r} has no NIC to reach other "
                    "machines; give it a 'nic' or connect a NIC over PCIe"
                )
            hit = (nic, ())
            self._nic[dev.name] = hit
        nic = hit[0]
        path = (
            self._bfs(dev.name, nic, LinkClass.PCIE, _PCIE_VIA)
            if outbound
            else self._bfs(nic, dev.name, LinkClass.PCIE, _PCIE_VIA)
        )
        if path is None:
            raise TopologyError(
                f"topology {self.topo.name!r}: no PCIe path between {dev.name!r} and its NIC {nic!r}"
            )
        return nic, path

    def _fabric_path(self, nic_a: str, nic_b: str) -> tuple[int, ...]:
        direct = self.link_id.get((nic_a, nic_b))
        if direct is not None and self.topo.links[direct].cls is LinkClass.NETWORK:
            return (direct,)
        links = self.topo.links
        first = [links[i].dst for i in self.out[nic_a] if links[i].cls is LinkClass.NETWORK]
        last = sorted(self._incoming(nic_b))
        best: list[list[str]] = []
        for s in first:
            for t in last:
                paths = self._switch_shortest(s, t)
                if paths and (not best or len(paths[0]) < len(best[0])):
                    best = paths
                elif paths and len(paths[0]) == len(best[0]):
                    best = best + paths
        if not best:
            raise TopologyError(
                f"topology {self.topo.name!r}: no network path from {nic_a!r} to {nic_b!r}"
            )
        pick = best[zlib.crc32(f"{nic_a}|{nic_b}".encode()) % len(best)]
        hops = [nic_a, *pick, nic_b]
        return tuple(self.link_id[(hops[k], hops[k + 1])] for k in range(len(hops) - 1))

    def _incoming(self, name: str) -> list[str]:
        """Devices with a network link into ``name``."""
        if self._in is None:
            self._in = {}
            for ln in self.topo.links:
                if ln.src != ln.dst and ln.cls is LinkClass.NETWORK:
                    self._in.setdefault(ln.dst, []).append(ln.src)
        return self._in.get(name, [])

    def _switch_shortest(self, s: str, t: str) -> list[list[str]]:
        """All shortest switch-only paths s..t (inclusive), cached; [] when none."""
        key = (s, t)
        hit = self._switch_paths.get(key)
        if hit is not None:
            return hit
        if s == t:
            paths = [[s]]
        else:
            g = self._switches()
            try:
                paths = sorted(nx.all_shortest_paths(g, s, t)) if s in g and t in g else []
            except nx.NetworkXNoPath:
                paths = []
        self._switch_paths[key] = paths
        return paths

    def _switches(self) -> nx.DiGraph:
        if self._switch_graph is None:
            g = nx.DiGraph()
            for d in self.topo.devices:
                if d.kind is DeviceKind.SWITCH:
                    g.add_node(d.name)
            for ln in self.topo.links:
                if ln.src in g and ln.dst in g and ln.cls is LinkClass.NETWORK:
                    g.add_edge(ln.src, ln.dst)
            self._switch_graph = g
        return self._switch_graph

    # -- search helpers ------------------------------------------------------------------------

    def _bfs(
        self, a: str, b: str, cls: LinkClass, via: frozenset[DeviceKind]
    ) -> tuple[int, ...] | None:
        """Fewest-hop path a..b over links of class ``cls`` whose inner vertices are of the
        kinds ``via``; among equal hops the first found (widest links explored first)."""
        links = self.topo.links
        prev: dict[str, int] = {a: -1}
        queue = deque([a])
        while queue:
            u = queue.popleft()
            for i in self.out[u]:
                ln = links[i]
                if ln.cls is not cls:
                    continue
                v = ln.dst
                if v in prev:
                    continue
                prev[v] = i
                if v == b:
                    path = []
                    while v != a:
                        j = prev[v]
                        path.append(j)
                        v = links[j].src
                    return tuple(reversed(path))
                if self.by_name[v].kind in via:
                    queue.append(v)
        return None

    def _nearest(self, a: str, kind: DeviceKind) -> str | None:
        """Closest device of ``kind`` over PCIe-class links (ties: first explored)."""
        links = self.topo.links
        seen = {a}
        queue = deque([a])
        while queue:
            u = queue.popleft()
            for i in self.out[u]:
                ln = links[i]
                if ln.cls is not LinkClass.PCIE:
                    continue
                v = ln.dst
                if v in seen:
                    continue
                seen.add(v)
                dev = self.by_name[v]
                if dev.kind is kind:
                    return v
                if dev.kind in _PCIE_VIA:
                    queue.append(v)
        return None
