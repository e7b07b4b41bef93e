"""Map a Topology onto network namespaces, Linux bridges and veth pairs (pure: no system calls).

Words we use. A *run id* (six hex digits) names one emulated cluster; everything it makes is
prefixed ``ta-RUNID-``. Each rank's device becomes a *rank namespace* ``ta-RUNID-rK`` with one
IPv4 address in 198.18.0.0/15 (the benchmarking range) on each of its interfaces. Every other
device a route crosses (switch, NVSwitch, PCIe switch, CPU, NIC) becomes a *bridge* in the
*fabric namespace* ``ta-RUNID-fab``, so nothing touches the root namespace's networking. Every
pair of devices joined by links that routes cross becomes one veth pair, a *cable*; each
direction of a cable is shaped on the egress of the end that sends it.

Why the kernel takes the topology's routes: a rank holds a /32 route per peer through the
interface of ``Topology.route``'s first hop; from there bridges forward at layer 2, and a
*segment* (bridges joined by cables) is required to be loop-free with each rank attached to
it at most once, so the path inside it is the only one there is. ``plan_layout`` computes
that kernel path for every ordered rank pair and refuses a topology where it differs from
``Topology.route``.

Rates: ``bw_gbps`` is message bytes per second. TCP carries 1448 payload bytes in a
1514-byte frame (timestamps on, MTU 1500) and the shapers count frames, so a link is
shaped at ``bw_gbps x scale x WIRE_FACTOR``: TCP payload then flows at the link's figure.
Latency cannot be added (no netem): ``latency_us`` is ignored here and calibration inside
the emulation measures what the real stack adds.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections import deque
from dataclasses import dataclass

from treeattn.errors import EmulationError, InputError, TopologyError
from treeattn.topology.model import Topology

__all__ = [
    "WIRE_FACTOR",
    "MIN_RATE_BIT",
    "MAX_RATE_BIT",
    "BASE_ADDRESS",
    "RUN_ID",
    "ns_prefix",
    "End",
    "Cable",
    "RankNet",
    "Shaper",
    "Layout",
    "plan_layout",
    "rank_ip",
    "scaled_topology",
]

WIRE_FACTOR = 1514 / 1448
"""Frame bytes per TCP payload byte for full-size segments (MTU 1500, TCP timestamps)."""
MIN_RATE_BIT = 100_000
"""Slowest shaped rate accepted (bit/s): below it a single frame takes over 0.1 s."""
MAX_RATE_BIT = 10_000_000_000
"""Fastest shaped rate accepted (bit/s). What a machine really reaches is lower: veths pass
one frame per packet (see ``commands``), and a 2-core host moves about 0.7-0.9 Gbit/s of
such a flow, so ``check`` shows links faster than that falling short of their rate."""
BASE_ADDRESS = ipaddress.IPv4Address("198.18.0.0")
"""Rank k gets BASE_ADDRESS + k + 1 (198.18.0.0/15 is reserved for benchmarking, RFC 2544)."""
RUN_ID = re.compile(r"^[0-9a-f]{6}$")
"""Shape of a run id."""


def ns_prefix(run_id: str) -> str:
    """Prefix of every namespace a run makes: ``ta-RUNID-``."""
    if not RUN_ID.match(run_id):
        raise EmulationError(f"run id {run_id!r} must be six lowercase hex digits, e.g. 3fa2c1")
    return f"ta-{run_id}-"


@dataclass(frozen=True, slots=True)
class End:
    """One end of a veth pair."""

    device: str
    """Topology device at this end."""
    ns: str
    ifname: str
    bridge: str | None
    """Bridge interface it is enslaved to (fabric namespace), None in a rank namespace."""


@dataclass(frozen=True, slots=True)
class Cable:
    """A veth pair joining two devices; links ``a -> b`` and ``b -> a`` ride on it."""

    a: End
    b: End

    def end_at(self, device: str) -> End:
        return self.a if self.a.device == device else self.b


@dataclass(frozen=True, slots=True)
class RankNet:
    """A rank's namespace, address and routes."""

    rank: int
    device: str
    ns: str
    ip: str
    ifaces: tuple[str, ...]
    """Its interfaces, one per cable; the address sits on each (as /32)."""
    routes: tuple[tuple[str, str], ...]
    """(peer address, interface) for every other rank: the first hop of the topology route."""

    @property
    def gloo_iface(self) -> str:
        """Interface to name in GLOO_SOCKET_IFNAME: any carries the rank's address."""
        return self.ifaces[0]


@dataclass(frozen=True, slots=True)
class Shaper:
    """Shaping of one link (one direction of a cable) on the egress of its sending end."""

    link: int
    """Index in ``Topology.links``."""
    ns: str
    ifname: str
    rate_bit: int
    """Frame rate in bit/s: bw_gbps x scale x 8e9 x WIRE_FACTOR."""
    pairs: tuple[tuple[int, int], ...]
    """Rank pairs (src, dst) whose path crosses this link: one fair-share class each."""


@dataclass(frozen=True)
class Layout:
    """Everything ``up`` creates for one topology, scale and run id."""

    run_id: str
    topology: str
    fingerprint: str
    scale: float
    fabric_ns: str | None
    """None when no route crosses a bridge (a full mesh)."""
    ranks: tuple[RankNet, ...]
    bridges: tuple[tuple[str, str], ...]
    """(bridge interface, device name)."""
    cables: tuple[Cable, ...]
    shapers: tuple[Shaper, ...]
    paths: dict[tuple[int, int], tuple[int, ...]]
    """Kernel path (link indices) of every ordered rank pair; equals ``Topology.route``."""

    @property
    def prefix(self) -> str:
        return ns_prefix(self.run_id)

    @property
    def namespaces(self) -> tuple[str, ...]:
        rank_ns = tuple(r.ns for r in self.ranks)
        return ((self.fabric_ns,) if self.fabric_ns else ()) + rank_ns

    def iface_link(self) -> dict[tuple[str, str], int]:
        """(namespace, interface) -> index of the link it sends."""
        return {(s.ns, s.ifname): s.link for s in self.shapers}


def rank_ip(rank: int) -> str:
    """Address of rank ``rank`` in every emulated cluster."""
    return str(BASE_ADDRESS + rank + 1)


def scaled_topology(topo: Topology, scale: float) -> Topology:
    """``topo`` with every link's bandwidth times ``scale``: the machine ``up --scale`` emulates,
    for the simulator to predict on (the same object when ``scale`` is 1)."""
    if scale == 1:
        return topo
    links = tuple(dataclasses.replace(ln, bw_gbps=ln.bw_gbps * scale) for ln in topo.links)
    return dataclasses.replace(topo, name=f"{topo.name} x{scale:g}", links=links)


def plan_layout(topo: Topology, *, scale: float = 1.0, run_id: str = "000000") -> Layout:
    """Lay ``topo`` out on namespaces, bridges and veths, and prove the kernel's paths.

    Args:
        topo: the topology; each rank on its own gpu or host device.
        scale: factor applied to every link's bandwidth (the files under
            ``topologies/emu-*.yaml`` already describe the emulated machine: 1.0).
        run_id: six hex digits naming the run.

    Returns:
        The layout; ``paths`` holds the kernel path of every rank pair.

    Raises:
        EmulationError: when ranks share a device, a rate is out of range, a bridged segment
            has a loop or attaches a rank twice, or a kernel path differs from the route.
    """
    prefix = ns_prefix(run_id)
    if not (isinstance(scale, (int, float)) and scale > 0):
        raise EmulationError(f"--scale must be > 0, got {scale!r}")
    p = topo.num_ranks
    if p < 2:  # a rank alone has no cable: no interface to carry its address
        raise InputError(f"topology {topo.name!r} places {p} rank: an emulated cluster is ranks joined by links; "
                         "give a topology, or a selection (--ranks), of 2 or more")
    rank_of: dict[str, int] = {}
    for r, dev in enumerate(topo.ranks):
        if dev in rank_of:
            raise EmulationError(
                f"topology {topo.name!r}: ranks {rank_of[dev]} and {r} share device {dev!r}; the "
                "emulator gives each rank its own namespace, so place one rank per device"
            )
        rank_of[dev] = r
    routes = {(a, b): topo.route(a, b) for a in range(p) for b in range(p) if a != b}

    # Cables (unordered device pairs) and bridges, in order of first link index.
    cable_key: dict[frozenset[str], int] = {}
    bridge_devs: set[str] = set()
    for path in routes.values():
        for k, i in enumerate(path):
            ln = topo.links[i]
            cable_key.setdefault(frozenset((ln.src, ln.dst)), i)
            if k and ln.src in rank_of:
                raise EmulationError(
                    f"topology {topo.name!r}: a route passes through rank device {ln.src!r}; "
                    "a rank namespace does not forward"
                )
            if k:
                bridge_devs.add(ln.src)
    pairs = sorted(cable_key, key=lambda c: cable_key[c])
    dev_index = {d.name: k for k, d in enumerate(topo.devices)}
    bridge_name = {d: f"br{dev_index[d]}" for d in bridge_devs}
    fabric_ns = prefix + "fab" if bridge_devs else None
    rank_ns = [f"{prefix}r{r}" for r in range(p)]
    ifaces: dict[str, list[str]] = {dev: [] for dev in rank_of}
    cables: list[Cable] = []
    by_pair: dict[frozenset[str], Cable] = {}
    for c, key in enumerate(pairs):
        ln = topo.links[cable_key[key]]
        ends = []
        for side, dev in (("a", ln.src), ("b", ln.dst)):
            if dev in rank_of:
                name = f"eth{len(ifaces[dev])}"
                ifaces[dev].append(name)
                ends.append(End(dev, rank_ns[rank_of[dev]], name, None))
            else:
                ends.append(End(dev, fabric_ns or "", f"v{c}{side}", bridge_name[dev]))
        cable = Cable(*ends)
        cables.append(cable)
        by_pair[key] = cable

    segment, attach, tree = _segments(topo.name, bridge_devs, by_pair, rank_of)
    ranks = []
    for r, dev in enumerate(topo.ranks):
        hops = []
        for b in range(p):
            if b != r:
                first = topo.links[routes[(r, b)][0]]
                hops.append((rank_ip(b), by_pair[frozenset((first.src, first.dst))].end_at(dev).ifname))
        ranks.append(RankNet(r, dev, rank_ns[r], rank_ip(r), tuple(ifaces[dev]), tuple(hops)))

    paths: dict[tuple[int, int], tuple[int, ...]] = {}
    for (a, b), route in routes.items():
        kpath = _kernel_path(topo, a, b, route, segment, attach, tree)
        if kpath != route:
            names = " -> ".join([topo.links[route[0]].src] + [topo.links[i].dst for i in route])
            raise EmulationError(
                f"topology {topo.name!r}: rank {a} -> rank {b} is routed {names}, but bridged at "
                f"layer 2 the kernel would go {_describe(topo, kpath)}; make the switch graph a tree"
            )
        paths[(a, b)] = kpath

    crossing: dict[int, list[tuple[int, int]]] = {}
    for pair, path in sorted(paths.items()):
        for i in path:
            crossing.setdefault(i, []).append(pair)
    shapers = []
    for i in sorted(crossing):
        ln = topo.links[i]
        exact = ln.bw_gbps * scale * 8e9 * WIRE_FACTOR
        rate = int(round(exact)) if MIN_RATE_BIT <= exact <= MAX_RATE_BIT else exact  # inf and NaN fail the test
        if not MIN_RATE_BIT <= rate <= MAX_RATE_BIT:
            raise EmulationError(
                f"topology {topo.name!r}: link {ln.src}->{ln.dst} ({ln.bw_gbps} GB/s) x scale {scale:g} "
                f"shapes to {rate / 1e6:.4g} Mbit/s, outside {MIN_RATE_BIT / 1e6:g}-{MAX_RATE_BIT / 1e6:g} "
                "Mbit/s; pick --scale so every link lands in that range"
            )
        end = by_pair[frozenset((ln.src, ln.dst))].end_at(ln.src)
        shapers.append(Shaper(i, end.ns, end.ifname, rate, tuple(crossing[i])))
    return Layout(
        run_id=run_id,
        topology=topo.name,
        fingerprint=topo.fingerprint,
        scale=float(scale),
        fabric_ns=fabric_ns,
        ranks=tuple(ranks),
        bridges=tuple(sorted(((bridge_name[d], d) for d in bridge_devs), key=lambda x: dev_index[x[1]])),
        cables=tuple(cables),
        shapers=tuple(shapers),
        paths=paths,
    )


def _segments(name, bridge_devs, by_pair, rank_of):
    """Group bridges into loop-free segments; map (rank device, segment) -> its bridge."""
    parent = {d: d for d in bridge_devs}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    adj: dict[str, list[str]] = {d: [] for d in bridge_devs}
    for key in sorted(by_pair, key=lambda k: sorted(k)):
        u, v = sorted(key)
        if u in bridge_devs and v in bridge_devs:
            ru, rv = find(u), find(v)
            if ru == rv:
                raise EmulationError(
                    f"topology {name!r}: the bridges {u!r} and {v!r} are joined twice (a loop through "
                    "the switch graph); layer-2 bridging needs a tree: drop a redundant link or route "
                    "fewer ranks over it"
                )
            parent[ru] = rv
            adj[u].append(v)
            adj[v].append(u)
    segment = {d: find(d) for d in bridge_devs}
    attach: dict[tuple[str, str], str] = {}
    for key in sorted(by_pair, key=lambda k: sorted(k)):
        u, v = sorted(key)
        for dev, other in ((u, v), (v, u)):
            if dev in rank_of and other in bridge_devs:
                seg = segment[other]
                if (dev, seg) in attach:
                    raise EmulationError(
                        f"topology {name!r}: rank device {dev!r} reaches one bridged segment through "
                        f"both {attach[(dev, seg)]!r} and {other!r}; the kernel could answer on either"
                    )
                attach[(dev, seg)] = other
    return segment, attach, adj


def _kernel_path(topo, a, b, route, segment, attach, tree) -> tuple[int, ...]:
    """Links the kernel crosses from rank a to rank b: the route's first hop, then layer 2."""
    src, dst = topo.ranks[a], topo.ranks[b]
    first = topo.links[route[0]]
    hop = first.dst
    devices = [src, hop]
    if hop != dst:
        if hop not in segment:
            return ()
        last = attach.get((dst, segment[hop]))
        if last is None:
            return ()
        prev = {hop: hop}
        queue = deque([hop])
        while queue:
            u = queue.popleft()
            for v in tree[u]:
                if v not in prev:
                    prev[v] = u
                    queue.append(v)
        inner = [last]
        while inner[-1] != hop:
            inner.append(prev[inner[-1]])
        devices = [src, *reversed(inner), dst]
    out = []
    for u, v in zip(devices, devices[1:], strict=False):
        try:
            out.append(topo.link_index(u, v))
        except TopologyError:
            raise EmulationError(
                f"topology {topo.name!r}: rank {a} -> rank {b} would cross {u} -> {v} at layer 2, but the "
                f"topology has no link {u}->{v}; give every cable both directions"
            ) from None
    return tuple(out)


def _describe(topo: Topology, path: tuple[int, ...]) -> str:
    if not path:
        return "nowhere (the destination is not on the segment the first hop enters)"
    return " -> ".join([topo.links[path[0]].src] + [topo.links[i].dst for i in path])
