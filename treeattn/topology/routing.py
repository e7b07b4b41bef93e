"""Routing between devices (docs/design.md section 4), cached so that fabrics of 16,000 GPUs
route in well under a second per thousand pairs.

A route is a tuple of indices into ``Topology.links``. Rules, in order:

1. Two ranks on one host: its loopback self-link.
2. Two GPUs joined by NVLink/xGMI, directly or through NVSwitches only (never through
   another GPU): that fabric, fewest hops first, widest first among equals.
3. Inside one machine: PCIe and socket links, through bridges and CPUs only; the shortest
   such path passes the lowest common bridge. A GPU without peer-to-peer bounces through
   host memory: up to its CPU, then down to the peer.
4. Otherwise through the network: each end reaches its NIC (the device's ``nic`` or the
   nearest one over PCIe), then the switch fabric (fewest switch hops); among equal-length
   switch paths one is picked by a hash of the two NICs (static ECMP), so flows spread
   over spines.

Costs: rules 2-3 search a few dozen devices of one machine. Rule 4 caches each device's
path to its NIC, answers the usual two-tier case (leaf -> spine -> leaf) with one set
intersection, and falls back to a breadth-first search, cached per source switch, for
deeper fabrics. Finished routes are cached per device pair.
"""

from __future__ import annotations

import zlib
from collections import deque
from typing import TYPE_CHECKING

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
            if len(ids) > 1:
                ids.sort(key=lambda i: (-links[i].bw_gbps, links[i].dst))
        self._routes: dict[tuple[str, str], tuple[int, ...]] = {}
        self._endpoints: dict[tuple[str, bool], tuple[str, tuple[int, ...]]] = {}
        self._island: dict[str, int] | None = None
        self._net: _SwitchFabric | None = None

    # -- public ---------------------------------------------------------------------------

    def device_route(self, a: str, b: str) -> tuple[int, ...]:
        key = (a, b)
        hit = self._routes.get(key)
        if hit is None:
            hit = self._compute(a, b)
            self._routes[key] = hit
        return hit

    def island(self, name: str) -> int:
        """Id of the NVLink/xGMI island of a device: devices joined by GPU-fabric links,
        directly or through NVSwitches; devices without such links are alone (-1)."""
        islands = self._island if self._island is not None else self._islands()
        return islands.get(name, -1)

    def nic_of(self, dev: Device) -> str | None:
        """The NIC carrying ``dev``'s network traffic (itself if it has network links), or
        None when none is reachable."""
        try:
            return self._endpoint(dev, outbound=True)[0]
        except TopologyError:
            return None

    def nic_path(self, dev: Device) -> tuple[str, tuple[int, ...]] | None:
        """The NIC carrying ``dev``'s network traffic and the links from ``dev`` to it, or None
        when none is reachable."""
        try:
            return self._endpoint(dev, outbound=True)
        except TopologyError:
            return None

    def nearest(self, name: str, kind: DeviceKind, through: frozenset[DeviceKind] = _PCIE_VIA) -> str | None:
        """Closest device of ``kind`` over PCIe-class links, passing only ``through`` kinds
        (ties: first explored)."""
        links = self.topo.links
        seen = {name}
        queue = deque([name])
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
                if dev.kind in through:
                    queue.append(v)
        return None

    def network_neighbors(self, name: str) -> list[str]:
        """Devices ``name`` has a network link to, sorted."""
        links = self.topo.links
        return sorted(links[i].dst for i in self.out[name] if links[i].cls is LinkClass.NETWORK)

    def network_gap(self) -> tuple[int, int] | None:
        """Two ranks whose route must cross the network (different machines, not one
        NVLink/xGMI island) but whose NICs the switch fabric does not join; None when there
        are none. Checking every rank against rank 0 misses these (two leaves that reach rank
        0's NIC but not each other); routing every pair would take minutes on a large
        fabric, so NICs are grouped by the switches they attach to and each group pair is
        checked once."""
        ranks = self.topo.ranks
        net = self._fabric()
        links = self.topo.links
        switch = net.sw_out
        # NICs with a network link to or from a non-switch (a cable between two NICs) keep
        # their identity in the grouping: such a link joins those two NICs only.
        cabled = {end for ln in links if ln.cls is LinkClass.NETWORK and ln.src != ln.dst
                  and ln.src not in switch and ln.dst not in switch for end in (ln.src, ln.dst)}
        out_groups: dict[tuple, list[int]] = {}
        in_groups: dict[tuple, list[int]] = {}
        nics: dict[int, tuple[str, str]] = {}
        for r, name in enumerate(ranks):
            dev = self.by_name[name]
            try:
                nic_o = self._endpoint(dev, outbound=True)[0]
                nic_i = self._endpoint(dev, outbound=False)[0]
            except TopologyError:
                continue  # reaches no other machine: routing to and from rank 0 reports it where it matters
            nics[r] = (nic_o, nic_i)
            key_o = (tuple(s for s, _ in net.first.get(nic_o, ())), nic_o if nic_o in cabled else None)
            key_i = (tuple(s for s, _ in net.last.get(nic_i, ())), nic_i if nic_i in cabled else None)
            out_groups.setdefault(key_o, []).append(r)
            in_groups.setdefault(key_i, []).append(r)
        if len(nics) < 2:
            return None
        ends = {s for key in out_groups for s in key[0]} | {t for key in in_groups for t in key[0]}
        joined = bool(ends) and net.strongly_joined(ends)

        def reaches(key_o: tuple, key_i: tuple) -> bool:
            if key_o[1] is not None and key_i[1] is not None:
                i = self.link_id.get((key_o[1], key_i[1]))
                if i is not None and links[i].cls is LinkClass.NETWORK:
                    return True
            if key_o[0] and key_i[0] and joined:
                return True
            return any(t in net._bfs_preds(s) for s in key_o[0] for t in key_i[0])

        islands = self._island if self._island is not None else self._islands()
        # A joined fabric joins every two groups on switches: of a sender group on one, only
        # receiver groups on none need checking (a group a leaf, one NIC a leaf at 2,048
        # nodes: 268 M pairs, 25 s). The order, and so the gap found first, stays the same.
        every_in = list(in_groups.items())
        unswitched_in = [kv for kv in every_in if not kv[0][0]] if joined else every_in
        for key_o, senders in out_groups.items():
            for key_i, receivers in unswitched_in if key_o[0] else every_in:
                if reaches(key_o, key_i):
                    continue
                for a in senders:
                    da = self.by_name[ranks[a]]
                    for b in receivers:
                        db = self.by_name[ranks[b]]
                        if a == b or nics[a][0] == nics[b][1] or (da.node == db.node and da.node >= 0):
                            continue  # no network hop, or one machine: PCIe first
                        isl = islands.get(ranks[a], -1)
                        if isl >= 0 and isl == islands.get(ranks[b], -1):
                            continue  # one NVLink/xGMI island
                        return a, b
        return None

    def _fabric(self) -> _SwitchFabric:
        """The network's switch fabric, built on first use."""
        if self._net is None:
            self._net = _SwitchFabric(self)
        return self._net

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
            islands = self._island if self._island is not None else self._islands()
            isl = islands.get(a, -1)
            if isl >= 0 and isl == islands.get(b, -1):
                path = self._bfs(a, b, LinkClass.GPU_FABRIC, _FABRIC_VIA)
                if path is not None:
                    return path
        if da.node == db.node and da.node >= 0:
            path = self._pcie_route(da, db)
            if path is not None:
                return path
            try:
                return self._network_route(da, db)
            except TopologyError as exc:  # the usual cause is not a missing NIC: say what joins one machine
                why = str(exc).removeprefix(f"topology {self.topo.name!r}: ")
                back = (self._bfs(b, a, LinkClass.GPU_FABRIC, _FABRIC_VIA) if da.kind is db.kind is DeviceKind.GPU
                        else None) or self._pcie_route(db, da)
                if back is not None:  # joined the other way only: a link written once, one way
                    raise TopologyError(
                        f"topology {self.topo.name!r}: {b!r} reaches {a!r} inside node {da.node} but not back: a "
                        "link on the way is one way (duplex: false) with no link the other way; make it duplex: "
                        "true or add the reverse link") from None
                raise TopologyError(
                    f"topology {self.topo.name!r}: {a!r} and {b!r} are on one machine (node {da.node}) but no GPU "
                    "fabric or PCIe path joins them; join their CPU sockets (a compact file's node.cpus.link, "
                    "e.g. {kind: upi, bw_gbps: 22}; an explicit file's link between the CPUs) or link the devices "
                    f"(over the network: {why})"
                ) from None
        return self._network_route(da, db)

    def _pcie_route(self, da: Device, db: Device) -> tuple[int, ...] | None:
        bounce = (da.kind is DeviceKind.GPU and not da.p2p) or (
            db.kind is DeviceKind.GPU and not db.p2p
        )
        if not bounce:
            return self._bfs(da.name, db.name, LinkClass.PCIE, _PCIE_VIA)
        cpu = self.nearest(da.name, DeviceKind.CPU)
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
            return up + down
        return up + self._fabric().path(nic_a, nic_b) + down

    # -- pieces ---------------------------------------------------------------------------------

    def _endpoint(self, dev: Device, outbound: bool) -> tuple[str, tuple[int, ...]]:
        """The NIC carrying ``dev``'s network traffic and the PCIe path to (or from) it."""
        key = (dev.name, outbound)
        hit = self._endpoints.get(key)
        if hit is not None:
            return hit
        links = self.topo.links
        if any(links[i].cls is LinkClass.NETWORK for i in self.out[dev.name]):
            hit = (dev.name, ())
        else:
            nic = dev.nic or self.nearest(dev.name, DeviceKind.NIC)
            if nic is None or nic not in self.by_name:
                raise TopologyError(
                    f"topology {self.topo.name!r}: {dev.name!r} has no NIC to reach other "
                    "machines; give it a 'nic' or connect a NIC over PCIe"
                )
            path = (
                self._bfs(dev.name, nic, LinkClass.PCIE, _PCIE_VIA)
                if outbound
                else self._bfs(nic, dev.name, LinkClass.PCIE, _PCIE_VIA)
            )
            if path is None:
                raise TopologyError(
                    f"topology {self.topo.name!r}: no PCIe path between {dev.name!r} and its NIC {nic!r}"
                )
            hit = (nic, path)
        self._endpoints[key] = hit
        return hit

    def _islands(self) -> dict[str, int]:
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            while parent.setdefault(x, x) != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for ln in self.topo.links:
            if ln.cls is LinkClass.GPU_FABRIC and ln.src != ln.dst:
                ra, rb = find(ln.src), find(ln.dst)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
        roots: dict[str, int] = {}
        out: dict[str, int] = {}
        for name in parent:
            out[name] = roots.setdefault(find(name), len(roots))
        self._island = out
        return out

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


class _SwitchFabric:
    """Network links between NICs (or networked hosts) and switches, for rule 4."""

    def __init__(self, index: RouteIndex) -> None:
        self.index = index
        links = index.topo.links
        switch = {d.name for d in index.topo.devices if d.kind is DeviceKind.SWITCH}
        out: dict[str, dict[str, int]] = {s: {} for s in switch}
        self.sw_in: dict[str, set[str]] = {s: set() for s in switch}
        # NIC -> [(first switch, link id)], NIC -> [(last switch, link id)], sorted by switch.
        self.first: dict[str, list[tuple[str, int]]] = {}
        self.last: dict[str, list[tuple[str, int]]] = {}
        for i, ln in enumerate(links):
            if ln.cls is not LinkClass.NETWORK or ln.src == ln.dst:
                continue
            s_sw, d_sw = ln.src in switch, ln.dst in switch
            if s_sw and d_sw:
                out[ln.src][ln.dst] = i
                self.sw_in[ln.dst].add(ln.src)
            elif d_sw:
                self.first.setdefault(ln.src, []).append((ln.dst, i))
            elif s_sw:
                self.last.setdefault(ln.dst, []).append((ln.src, i))
        for table in (self.first, self.last):
            for v in table.values():
                v.sort()
        # Switch -> {next switch: link id}, in name order (ECMP picks by position).
        self.sw_out: dict[str, dict[str, int]] = {s: dict(sorted(nxt.items())) for s, nxt in out.items()}
        self._preds: dict[str, dict[str, list[str]]] = {}

    def path(self, a: str, b: str) -> tuple[int, ...]:
        direct = self.index.link_id.get((a, b))
        if direct is not None and self.index.topo.links[direct].cls is LinkClass.NETWORK:
            return (direct,)
        h = zlib.crc32(f"{a}|{b}".encode())
        best: list[tuple[int, ...]] = []
        for s, up in self.first.get(a, ()):
            for t, down in self.last.get(b, ()):
                mid = self._segment(s, t, h)
                if mid is None:
                    continue
                if not best or len(mid) + 2 < len(best[0]):
                    best = [(up, *mid, down)]
                elif len(mid) + 2 == len(best[0]):
                    best.append((up, *mid, down))
        if not best:
            raise TopologyError(
                f"topology {self.index.topo.name!r}: no network path from {a!r} to {b!r}"
            )
        return best[0] if len(best) == 1 else best[h % len(best)]

    def _segment(self, s: str, t: str, h: int) -> tuple[int, ...] | None:
        """Link ids of one shortest switch path s..t (None: unreachable); ``h`` picks
        among equal ones."""
        if s == t:
            return ()
        nxt = self.sw_out[s]
        direct = nxt.get(t)
        if direct is not None:
            return (direct,)
        into_t = self.sw_in[t]
        mids = [m for m in nxt if m in into_t]
        if mids:
            m = mids[h % len(mids)]
            return (nxt[m], self.sw_out[m][t])
        preds = self._bfs_preds(s)
        if t not in preds:
            return None
        ids = []
        v = t
        while v != s:
            options = preds[v]
            u = options[h % len(options)]
            h //= len(options)
            ids.append(self.sw_out[u][v])
            v = u
        return tuple(reversed(ids))

    def strongly_joined(self, ends: set[str]) -> bool:
        """Whether every switch of ``ends`` reaches every other over switch links: all are
        reached from one of them (``_bfs_preds``) and reach it back (over ``sw_in``)."""
        root = min(ends)
        if not ends <= self._bfs_preds(root).keys():
            return False
        seen = {root}
        queue = deque([root])
        while queue:
            for v in self.sw_in[queue.popleft()]:
                if v not in seen:
                    seen.add(v)
                    queue.append(v)
        return ends <= seen

    def _bfs_preds(self, s: str) -> dict[str, list[str]]:
        """Breadth-first search over switches from ``s``: for each reached switch, its
        predecessors on shortest paths (sorted). Cached per source switch."""
        hit = self._preds.get(s)
        if hit is not None:
            return hit
        dist = {s: 0}
        preds: dict[str, list[str]] = {s: []}
        layer = [s]
        while layer:
            nxt: list[str] = []
            for u in layer:
                du = dist[u] + 1
                for v in self.sw_out[u]:
                    dv = dist.get(v)
                    if dv is None:
                        dist[v] = du
                        preds[v] = [u]
                        nxt.append(v)
                    elif dv == du:
                        preds[v].append(u)
            layer = nxt
        for v in preds.values():
            v.sort()
        self._preds[s] = preds
        return preds
