"""What NCCL's model needs to know about a topology (``NcclFabric``), derived from it (``fabric``).

Bandwidth (GB/s): ``bus`` = the slowest per-rank intra-node bandwidth (when a node holds
more than one rank) and the slowest node's network bandwidth (when there is more than one
node), whichever is smaller. Each link counts at NCCL's rating of it
(``treeattn.cost.nccl_rates``). Per-rank intra = its GPU-fabric links summed (NCCL spreads its
channels over all of them), else its PCIe uplinks, else its loopback link. Per-node
inter = the egress of the NICs its ranks use, summed (NIC bandwidth x NICs per node).
A node is NCCL's: one NVLink domain spanning machines (GB200 NVL72, multi-node NVLink) is one
node.

Routes (what NCCL's figures above do not see). Those figures count a rank's own links only;
the topology's routes can be narrower where several of the collective's concurrent flows
cross one link: a PCIe switch uplink shared by the GPUs below it, a copy bounced through
host memory (GPUs without peer-to-peer: every flow goes up to the CPU and down again), a
loopback shared by all ranks of a host, an oversubscribed network link. So each figure is
capped by the flows NCCL would run, fair-shared (max-min) over the links that more than
one of them crosses, at NCCL's scaled capacities, each flow also capped by its NCCL figure:

* ring, inside each node: rank i -> rank i+1 of the node, cyclically (rank order: the
  topologies number ranks domain by domain, which is the ring NCCL's search finds there);
  ``intra`` = min(NCCL's figure, the slowest such flow);
* tree, inside each node: the chain NCCL uses, up and down at once (i -> i+1 and
  i+1 -> i); each flow capped at half the rank's figure since NCCL's tree bandwidth already
  halves it for the two directions a rank's egress carries; ``tree_intra`` = twice the
  slowest flow, at most the rank's figure;
* across nodes, one channel per NIC: the first rank using the node's k-th NIC -> the rank
  using the k-th NIC of the next node (cyclically); ``inter`` = min(NCCL's figure, the
  slowest node's sum of its channels' rates). A tree on two nodes takes twice ``inter``
  (``NcclFabric.tree_bus_bw_gbps``).

Ranks of a node joined by one GPU fabric (NVLink/xGMI, NVSwitch) keep NCCL's figure: NCCL
spreads channels over every fabric link (a hybrid cube-mesh's rings use all six NVLinks),
which one route per rank pair cannot show. Per-hop latency is at least the route's own
(the sum of its links' ``latency_us``): max(NCCL's constant, the slowest ring hop's
route) inside a node and across nodes (a bounce through host memory crosses four links).

The fabric also carries what the estimate (``treeattn.cost.nccl``) reads besides: NCCL's
channels (``treeattn.cost.nccl_channels``), the NVLink figure NVLS runs at
(``treeattn.cost.nvls``), the xGMI figure of RCCL's all-pairs all-reduce
(``treeattn.cost.msccl``), the shared-memory rate (``treeattn.cost.nccl_rates``), the hosts'
CPU vendor and the NCCL release (``treeattn.topology.nccl_version``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from treeattn.cost import msccl
from treeattn.cost.nccl_channels import comm_channels, graph_channels
from treeattn.cost.nccl_paths import NcclPaths, ll128_enabled
from treeattn.cost.nccl_rates import (
    cpu_vendor,
    fabric_bw,
    nccl_link_bw_gbps,
    nic_bw,
    shm_pair_gbps,
    shm_rate_gbps,
)
from treeattn.cost.nccl_tuning import nccl_arch
from treeattn.topology.model import P2P_LEVELS, DeviceKind, Link, LinkClass, LinkKind, Topology
from treeattn.topology.nccl_version import NEWEST, Release, nccl_release

__all__ = [
    "NcclFabric",
    "fabric",
]


@dataclass(frozen=True, slots=True)
class NcclFabric:
    """What NCCL's model needs to know about a topology."""

    ranks: int
    nodes: int
    intra_bw_gbps: float
    """Slowest per-rank intra-node bandwidth of the ring: NCCL's figures, capped by the routes'
    shared links (inf when every node holds one rank)."""
    inter_bw_gbps: float
    """Slowest node's network bandwidth, capped by the routes' shared links (inf on one node)."""
    intra_hw: str
    """``nvlink`` or ``pci``: which hop latencies apply inside a node."""
    arch: str
    """GPU generation for llMaxBw: volta, ampere, hopper, blackwell."""
    ll128: bool
    """Whether NCCL runs LL128 on its ring (``nccl_paths``: the node's GPUs joined by NVLink,
    and across nodes near enough to the NICs)."""
    tree_ll128: bool = True
    """Whether NCCL runs LL128 on its tree (``nccl_paths``: on Hopper and later the tree
    leaves a node by one GPU, the ring by two)."""
    tree_intra_bw_gbps: float = math.inf
    """Like ``intra_bw_gbps`` for the tree's intra-node chain (inf: same as the ring's)."""
    intra_route_us: float = 0.0
    """Route latency of the slowest intra-node ring hop (a floor for NCCL's per-hop constant)."""
    inter_route_us: float = 0.0
    """Route latency of the slowest cross-node channel hop."""
    limit: str = ""
    """Which shared link capped a figure, in words (empty when NCCL's own figures stand)."""
    cpu: str = "intel"
    """CPU vendor of the hosts (``intel``, ``amd``, ``other``): NCCL's multi-node llMaxBw row and
    its per-step network overhead depend on it."""
    nvls_gbps: float = 0.0
    """A GPU's NVLink bandwidth as NCCL rates it when NVLink SHARP can run (Hopper or newer,
    every node's ranks on one NVSwitch fabric), else 0."""
    channels: int = 0
    """NCCL's ring/tree channel count (``treeattn.cost.nccl_channels``); 0: unknown, every
    size runs on all channels."""
    ring_gbps: float = 0.0
    """NCCL's per-channel ring speed times ``channels`` (its ring's search bandwidth)."""
    graph_channels: int = 0
    """Channels of NCCL's ring/tree graph (``nccl_channels.graph_channels``), which its
    per-channel caps multiply; 0: no caps."""
    nics: int = 0
    """NICs of a node NCCL's ring leaves it by (one channel each; several nodes only), 0 where
    the ring does not leave a node by NICs: with two or more, each channel of the ring graph
    enters the node by its own NIC, so the graph's channels differ (``sameChannels`` 0)."""
    nccl_release: Release = NEWEST
    """The NCCL release whose release-dependent figures apply (``treeattn.topology.nccl_version``;
    NVLS only); default: the newest the model follows."""
    rccl: bool = False
    """Whether the GPUs are AMD's (xGMI): RCCL, which the model times with NCCL's figures
    except where its MSCCL all-pairs algorithm runs."""
    gfx90a: bool = False
    """Whether every GPU is a gfx90a part (MI210, MI250, MI250X): the one RCCL runs LL128 on by
    default (``nccl.pick``)."""
    allpairs_gbps: float = 0.0
    """NCCL's rating of the xGMI link joining each pair of a one-node RCCL fabric of 8 ranks,
    where RCCL's MSCCL all-pairs all-reduce runs (``treeattn.cost.msccl``); 0: not such a node."""
    shm_gbps: float = 0.0
    """What NCCL's shared-memory transport moves (``shm_rate_gbps``) when a ring hop inside a node
    goes through it (``shm_pair_gbps``): what runs stays under it as bus bandwidth (NCCL's
    estimate, which picks, rates the path at PCIe speed); 0: no such hop."""

    @property
    def bus_bw_gbps(self) -> float:
        bw = min(self.intra_bw_gbps, self.inter_bw_gbps)
        return bw if math.isfinite(bw) else 0.0

    @property
    def tree_bus_bw_gbps(self) -> float:
        """The bus bandwidth of the tree algorithm: its intra-node chain (which may share links
        differently) and, on two nodes, twice the network. There each node is the root of one
        of NCCL's two trees and a leaf of the other, so a byte crosses the network once each
        way, where NCCL's tree bus bandwidth counts a rank's bytes twice; NCCL's search raises
        the tree graph's intra-node speed up to twice its network speed (``search.cc``
        ``ncclTopoCompute``, pass 2, "increase bwIntra for trees (2 nodes or collnet)"; to the
        first step of its speed list at or above twice, or the list's top) and its
        estimate rates a tree on two nodes by that speed (``tuning.cc``: ``nNodes <= 2 ?
        bwIntra : bwInter``)."""
        intra = self.tree_intra_bw_gbps if math.isfinite(self.tree_intra_bw_gbps) else self.intra_bw_gbps
        bw = min(intra, self.inter_bw_gbps * (2 if self.nodes == 2 else 1))
        return bw if math.isfinite(bw) else 0.0


def fabric(topo: Topology) -> NcclFabric:
    """Summarize ``topo`` for NCCL's model: ranks, nodes, intra and inter bandwidth.

    Args:
        topo: the topology; a node is a value of ``Device.node`` holding a rank.

    Returns:
        The NcclFabric (see the module docstring for how each figure is derived), from the
        hardware's link ratings where a calibration measured the links (``Topology.rated``).
    """
    topo = topo.rated
    devs = [topo.rank_device(r) for r in range(topo.num_ranks)]
    gpu_models = [d.model for d in devs if d.kind is DeviceKind.GPU]
    arch = nccl_arch(gpu_models[0]) if gpu_models else "hopper"
    out: dict[str, list[Link]] = {}
    for ln in topo.links:
        out.setdefault(ln.src, []).append(ln)
    per_node = _nccl_nodes(topo, devs)
    nodes = len(per_node)
    routes = _Routes(topo)
    # Intra-node bandwidth of each rank that shares its node: NCCL's figure, then the routes.
    intra = math.inf
    own: dict[int, float] = {}
    ring: list[tuple[tuple[int, ...], float]] = []
    chain: list[tuple[tuple[int, ...], float]] = []
    intra_route = 0.0
    path_gbps = 0.0
    intra_pairs: list[tuple[int, int]] = []
    for _, ranks in sorted(per_node.items()):
        if len(ranks) < 2:
            continue
        for r in ranks:
            links = out.get(devs[r].name, [])
            path_gbps = max(path_gbps, _peer_path_gbps(topo, links, arch))
            pick_links = (
                [ln for ln in links if ln.cls is LinkClass.GPU_FABRIC]
                or [ln for ln in links if ln.cls is LinkClass.PCIE]
                or [ln for ln in links if ln.cls is LinkClass.LOOPBACK]
                or links
            )
            bw = sum(nccl_link_bw_gbps(ln, arch) for ln in pick_links)
            own[r] = bw if bw > 0 else math.inf
            if bw > 0:
                intra = min(intra, bw)
        n = len(ranks)
        pairs = [(ranks[i], ranks[(i + 1) % n]) for i in range(n)]
        intra_pairs += pairs
        if routes.one_fabric(ranks):
            # NCCL's channels use every fabric link; only the hop latency comes from the routes.
            intra_route = max([intra_route] + [routes.latency(a, b) for a, b in pairs if routes.on_fabric(a, b)])
            continue
        ring.extend((routes.route(a, b), own[a]) for a, b in pairs)
        for i in range(n - 1):
            a, b = ranks[i], ranks[i + 1]
            chain.append((routes.route(a, b), own[a] / 2))
            chain.append((routes.route(b, a), own[b] / 2))
        intra_route = max([intra_route] + [routes.latency(a, b) for a, b in pairs])
    limits: list[str] = []
    tree_intra = intra
    if ring:
        rates, why = routes.fair(ring)
        if min(rates) < intra:
            limits.append(f"ring inside a node: {why}")
            intra = min(rates)
        rates, why = routes.fair(chain)
        if 2 * min(rates) < tree_intra:
            limits.append(f"tree chain inside a node: {why}")
            tree_intra = 2 * min(rates)
    inter = math.inf
    inter_route = 0.0
    n_nics, nic_gbps = 0, 0.0
    fabric_peers = False
    release = nccl_release(topo.cost.nccl_version) if topo.cost.nccl_version is not None else NEWEST
    hopper = arch in ("hopper", "blackwell")  # MI300X too: HIP gives gfx942 compute capability 9.4
    # NCCL's path types (nccl_paths): what decides LL128 and the intra-node hop latencies.
    paths = NcclPaths(topo)
    type_intra = max((paths.intra_type(ranks) for ranks in per_node.values()), key=P2P_LEVELS.index)
    inter_ring = inter_tree = "LOC"
    if nodes > 1:
        ordered = [ranks for _, ranks in sorted(per_node.items())]
        flows: list[tuple[tuple[int, ...], float]] = []
        owner: list[int] = []
        for i, ranks in enumerate(ordered):
            nxt = ordered[(i + 1) % nodes]
            peers = [(r, nxt[j % len(nxt)]) for j, r in enumerate(ranks)]
            if all(routes.on_fabric(a, b) for a, b in peers):
                # One NVLink domain across machines (GB200 NVL72): every GPU drives its own
                # fabric links to the next machine, at NCCL's fabric figure.
                chans = [(a, b, fabric_bw(out.get(devs[a].name, ()), arch)) for a, b in peers]
                fabric_peers = True
            else:
                # One channel per NIC: its first rank to the rank on the same NIC index next door.
                first: dict[str, int] = {}
                for r in ranks:
                    first.setdefault(_nic_of(topo, r, out, per_node), r)
                nics = sorted(first.items())
                nxt_first: dict[str, int] = {}
                for r in nxt:
                    nxt_first.setdefault(_nic_of(topo, r, out, per_node), r)
                targets = [r for _, r in sorted(nxt_first.items())]
                chans = [(r, targets[k % len(targets)], nic_bw(out.get(nic, ()))) for k, (nic, r) in enumerate(nics)]
                ring_type, tree_type = paths.inter_types(ranks, nxt[0], release, hopper)
                inter_ring = max(inter_ring, ring_type, key=P2P_LEVELS.index)
                inter_tree = max(inter_tree, tree_type, key=P2P_LEVELS.index)
            inter = min(inter, sum(bw for _, _, bw in chans))
            if i == 0:
                n_nics, nic_gbps = len(chans), max((bw for _, _, bw in chans), default=0.0)
            for a, b, bw in chans:
                flows.append((routes.route(a, b), bw if bw > 0 else math.inf))
                owner.append(i)
                inter_route = max(inter_route, routes.latency(a, b))
        rates, why = routes.fair(flows)
        sums = [0.0] * nodes
        for i, rate in zip(owner, rates, strict=True):
            sums[i] += rate
        if min(sums) < inter:
            inter = min(sums)
            limits.append(f"channels across nodes: {why}")
    gpu_gbps = min(own.values()) if own else 0.0
    gpu_gbps = gpu_gbps if math.isfinite(gpu_gbps) else 0.0
    # RCCL (AMD GPUs, xGMI) runs small all-reduces through its MSCCL/MSCCL++ kernels, not
    # NCCL's channel loop (AMD in ROCm/rccl issue 1562): its channel counts are left out.
    rccl = any(ln.kind is LinkKind.XGMI for ln in topo.links)
    gpus = all(d.kind is DeviceKind.GPU for d in devs)
    searched = (own or nodes > 1) and not rccl
    channels, ring_gbps = (comm_channels(arch, nodes, path_gbps or gpu_gbps, gpu_gbps, n_nics, nic_gbps)
                           if searched else (0, 0.0))
    graph = graph_channels(arch, nodes, path_gbps or gpu_gbps, gpu_gbps, n_nics, nic_gbps)[0] if searched else 0
    return NcclFabric(
        nccl_release=release,
        shm_gbps=shm_rate_gbps(topo) if any(shm_pair_gbps(topo, a, b) < math.inf for a, b in intra_pairs) else 0.0,
        rccl=rccl,
        gfx90a=bool(gpu_models) and all(re.search(r"MI2[0-9]0", m.upper()) for m in gpu_models),
        allpairs_gbps=_allpairs_gbps(topo, arch) if rccl and nodes == 1 else 0.0,
        channels=channels,
        graph_channels=graph,
        nics=n_nics if nodes > 1 and not fabric_peers else 0,
        ring_gbps=ring_gbps,
        cpu=cpu_vendor(topo),
        nvls_gbps=_nvls_gbps(topo, devs, per_node, out, arch),
        ranks=topo.num_ranks,
        nodes=nodes,
        intra_bw_gbps=intra,
        inter_bw_gbps=inter,
        intra_hw="nvlink" if type_intra == "NVL" else "pci",
        arch=arch,
        ll128=gpus and ll128_enabled(type_intra, inter_ring, hopper, rccl, release),
        tree_ll128=gpus and ll128_enabled(type_intra, inter_tree, hopper, rccl, release),
        tree_intra_bw_gbps=tree_intra,
        intra_route_us=intra_route,
        inter_route_us=inter_route,
        limit="; ".join(limits),
    )


def _allpairs_gbps(topo: Topology, arch: str) -> float:
    """The slowest xGMI link joining two of the ranks, as NCCL rates it, when every pair of
    exactly ``msccl.ALLPAIRS_GPUS`` ranks has one of its own; else 0."""
    p = topo.num_ranks
    if p != msccl.ALLPAIRS_GPUS:
        return 0.0
    links = [topo.route(a, b) for a in range(p) for b in range(p) if a != b]
    if any(len(r) != 1 or topo.links[r[0]].kind is not LinkKind.XGMI for r in links):
        return 0.0
    return min(nccl_link_bw_gbps(topo.links[r[0]], arch) for r in links)


def _nccl_nodes(topo: Topology, devs: list) -> dict[tuple[int, int], list[int]]:
    """Ranks by node as NCCL counts nodes: machines, except that one NVLink domain spanning
    machines (GB200 NVL72 with NCCL's multi-node NVLink) is one node."""
    isl = [topo.fabric_island(d.name) for d in devs]
    machines: dict[int, set[int]] = {}
    for i, d in zip(isl, devs, strict=True):
        if i >= 0:
            machines.setdefault(i, set()).add(d.node)
    out: dict[tuple[int, int], list[int]] = {}
    for r, (i, d) in enumerate(zip(isl, devs, strict=True)):
        key = (1, i) if i >= 0 and len(machines[i]) > 1 else (0, d.node)
        out.setdefault(key, []).append(r)
    return out


def _nvls_gbps(topo: Topology, devs: list, per_node: dict, out: dict[str, list[Link]], arch: str) -> float:
    """A GPU's NVLink figure when every node's ranks (two or more) share an NVSwitch fabric."""
    if arch not in ("hopper", "blackwell"):
        return 0.0
    island = topo.fabric_island
    switched = {island(d.name) for d in topo.devices if d.kind is DeviceKind.NVSWITCH} - {-1}
    for ranks in per_node.values():
        if len(ranks) < 2 or len({island(devs[r].name) for r in ranks} - switched) or \
                len({island(devs[r].name) for r in ranks}) != 1:
            return 0.0
    return min(fabric_bw(out.get(devs[r].name, ()), arch) for r in range(len(devs)))


def _peer_path_gbps(topo: Topology, links: list[Link], arch: str) -> float:
    """The fastest path from a GPU to one peer as NCCL rates it: all its links through an
    NVSwitch, the links to one peer on a direct mesh, else its PCIe uplink."""
    fabric_links = [ln for ln in links if ln.cls is LinkClass.GPU_FABRIC]
    if not fabric_links:
        return max((nccl_link_bw_gbps(ln, arch) for ln in links if ln.cls is LinkClass.PCIE), default=0.0)
    by_peer: dict[str, float] = {}
    for ln in fabric_links:
        by_peer[ln.dst] = by_peer.get(ln.dst, 0.0) + nccl_link_bw_gbps(ln, arch)
    switched = any(topo.device(d).kind is DeviceKind.NVSWITCH for d in by_peer)
    return sum(by_peer.values()) if switched else max(by_peer.values())


class _Routes:
    """Routes between ranks, and max-min fair shares of concurrent flows over them."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo

    def route(self, a: int, b: int) -> tuple[int, ...]:
        return self.topo.route(a, b)

    def latency(self, a: int, b: int) -> float:
        return self.topo.route_latency_us(a, b)

    def on_fabric(self, a: int, b: int) -> bool:
        links = self.topo.links
        return all(links[i].cls is LinkClass.GPU_FABRIC for i in self.topo.route(a, b))

    def one_fabric(self, ranks: list[int]) -> bool:
        """Whether these ranks are GPUs of one NVLink/xGMI island."""
        isl = {self.topo.fabric_island(self.topo.ranks[r]) for r in ranks}
        return len(isl) == 1 and -1 not in isl and all(
            self.topo.rank_device(r).kind is DeviceKind.GPU for r in ranks)

    def fair(self, flows: list[tuple[tuple[int, ...], float]]) -> tuple[list[float], str]:
        """Max-min fair rates (GB/s) of concurrent ``flows`` (route, own cap) over the links'
        capacities (``bw_gbps``, as the simulator shares them; progressive filling), and a
        phrase naming the link that bound the slowest flow (empty when its own cap did)."""
        links = self.topo.links
        users: dict[int, list[int]] = {}
        rate: list[float] = []
        fixed_by: list[int] = []
        for f, (route, cap) in enumerate(flows):
            for i in set(route):
                users.setdefault(i, []).append(f)
            # A link only this flow crosses just caps it: its narrowest one.
            narrow = min(route, key=lambda i: (links[i].bw_gbps, i), default=-1)
            alone = narrow >= 0 and links[narrow].bw_gbps < cap
            rate.append(links[narrow].bw_gbps if alone else cap)
            fixed_by.append(narrow if alone else -1)
        shared = {i: us for i, us in users.items() if len(us) > 1}
        on_shared: dict[int, list[int]] = {}
        for i, us in shared.items():
            for f in us:
                on_shared.setdefault(f, []).append(i)
        left = {i: links[i].bw_gbps for i in shared}
        count = {i: len(us) for i, us in shared.items()}
        # Progressive filling over the shared links; a flow's own limit (cap or narrowest
        # link) fixes it when it is smaller than every share it sees.
        todo = sorted(on_shared, key=lambda f: (rate[f], f))
        done: set[int] = set()
        k = 0
        while k < len(todo):
            link, share = -1, math.inf
            for i, c in count.items():
                if c and left[i] / c < share:
                    link, share = i, left[i] / c
            f_own = todo[k]
            if rate[f_own] <= share:
                fix, value, by = [f_own], rate[f_own], fixed_by[f_own]
            else:
                fix, value, by = [f for f in shared[link] if f not in done], share, link
            for f in fix:
                rate[f], fixed_by[f] = value, by
                done.add(f)
                for i in on_shared[f]:
                    count[i] -= 1
                    left[i] = max(left[i] - value, 0.0)
            while k < len(todo) and todo[k] in done:
                k += 1
        slowest = min(range(len(flows)), key=lambda f: (rate[f], f)) if flows else -1
        why = ""
        if slowest >= 0 and fixed_by[slowest] >= 0:
            i = fixed_by[slowest]
            ln = links[i]
            why = f"link {ln.src}->{ln.dst} ({ln.bw_gbps:.4g} GB/s) carries {len(users[i])} of its flows"
        return rate, why


def _nic_of(topo: Topology, rank: int, out: dict[str, list[Link]], per_node: dict[int, list[int]]) -> str:
    """The device whose network links carry ``rank``'s cross-node traffic."""
    dev = topo.rank_device(rank)
    if any(ln.cls is LinkClass.NETWORK for ln in out.get(dev.name, ())):
        return dev.name
    if dev.nic:
        return dev.nic
    # Ask routing: the first network hop towards a rank on another node starts at the NIC.
    other = next(rs[0] for _, rs in sorted(per_node.items()) if rank not in rs)
    for i in topo.route(rank, other):
        ln = topo.links[i]
        if ln.cls is LinkClass.NETWORK:
            return ln.src
    return dev.name
