"""NCCL's path types between a node's GPUs and to its NICs, and what its tuning decides by them.

NCCL types every path by its worst hop (``src/graph/paths.cc``; ``P2P_LEVELS``, nearest first)
and searches its ring and tree graphs (``src/graph/search.cc``) from the nearest types up:
a graph's ``typeIntra`` is the worst path between consecutive GPUs of a node, its
``typeInter`` the worst path from the GPU a channel enters a node by, or leaves it by, to the
NIC. The tuner (``src/graph/tuning.cc`` ncclTopoTuneModel, ``isLL128Enabled``) then:

* enables LL128 only where ``typeIntra <= PATH_NVB`` (``PATH_NVL`` before 2.18.3, and on RCCL)
  and ``typeInter <= PATH_PXB``, or ``PATH_PXN`` from compute capability 9.0 (2.17.1 on;
  ``NCCL_LL128_C2C``'s default); RCCL ``PATH_PXB``;
* times intra-node hops at NVLink's latencies only where ``typeIntra`` is ``PATH_NVL``
  (``intraHw``), else at PCIe's.

What is read here, from the topology's routes between the node's ranks (NCCL builds its system
from the communicator's GPUs only, so a GPU outside it joins no path):

* two ranks are NVL where their route is GPU-fabric links only (NVSwitches allowed) through no
  other GPU, with peer-to-peer on (not NCCL's shared-memory transport); NVB where one rank of
  the node joins them by NVL hops (``pathMaxLength``: one intermediate GPU);
* a node's ``typeIntra`` is NVL where the NVL pairs can close a ring, NVB where NVL and NVB
  pairs can, else beyond NVB. "Can close a ring": connected, every rank with two partners
  (one for a pair of ranks) -- what a ring needs, not a search for one;
* a rank's path to one of the node's NICs (those its ranks' traffic leaves by) is the route's
  type (``net_path_type`` for its own NIC), or PXN where it is further than PXN and a rank it
  reaches by NVL is within PXB of that NIC (P2C too from 2.28.3, ``NCCL_PXN_C2C``) (``paths.cc``,
  PXN on by default); before 2.27, which has no P2C type, a path through a CPU reached by C2C
  is PHB;
* a ring enters a node by one GPU and leaves it by another through the same NIC
  (``crossNic`` 0, which the search keeps while PXN can serve: NVIDIA/nccl issues 1313 and
  1899), so its ``typeInter`` is, at the NIC that gives the least, the second nearest rank's
  (the nearest where the node has one rank); the tree's on Hopper and later is the nearest
  rank's (one GPU to the NIC and back), before Hopper the ring's (``BALANCED_TREE``). Over
  nodes, the worst;
* the tree's ``typeIntra`` is taken as the ring's, though its chain has no closing pair;
* RCCL's search is taken as NCCL's, MI300X (gfx942: compute capability 9.4 to HIP) as Hopper.

Not modelled: GPUDirect RDMA. Where it is off (a socket transport, a NIC without peer
memory), NCCL sends every GPU-NIC path through the CPU and runs no LL128 across nodes; the
model assumes it wherever the NIC is within ``PATH_PXB``.
"""

from __future__ import annotations

from treeattn.cost.nccl_rates import shm_pair, via_type
from treeattn.topology.model import P2P_LEVELS, DeviceKind, Link, LinkClass, LinkKind, Topology
from treeattn.topology.nccl_version import Release

__all__ = ["NcclPaths", "net_path_type", "ll128_enabled", "BEYOND_NVB"]

NVB_INTRA_FROM: Release = (2, 18, 3)
"""The first release whose LL128 allows ``typeIntra`` NVB (``PATH_NVL`` before)."""
HOPPER_PXN_FROM: Release = (2, 17, 1)
"""The first release whose LL128 allows ``typeInter`` PXN from compute capability 9.0."""
P2C_FROM: Release = (2, 27, 3)
"""The first release with the P2C path type (GPU, C2C, CPU, PCIe to the NIC); PHB before."""
PXN_C2C_FROM: Release = (2, 28, 3)
"""The first release whose PXN passes through a GPU whose NIC is P2C (``NCCL_PXN_C2C`` 1)."""
BEYOND_NVB = "PHB"
"""The ``intra_type`` of a node whose ranks no NVLink ring joins (PCIe or host memory)."""


def _level(kind: str) -> int:
    return P2P_LEVELS.index(kind)


def _closes_ring(ranks: list[int], pairs: set[frozenset[int]]) -> bool:
    """Whether ``pairs`` could join ``ranks`` in a ring: connected, every rank with two
    partners (one where there are two ranks)."""
    partners: dict[int, set[int]] = {r: set() for r in ranks}
    for pair in pairs:
        a, b = tuple(pair)
        partners[a].add(b)
        partners[b].add(a)
    need = 1 if len(ranks) == 2 else 2
    if any(len(p) < need for p in partners.values()):
        return False
    seen, todo = {ranks[0]}, [ranks[0]]
    while todo:
        for q in partners[todo.pop()] - seen:
            seen.add(q)
            todo.append(q)
    return len(seen) == len(ranks)


def net_path_type(topo: Topology, rank: int, other: int) -> str:
    """NCCL's path type (``P2P_LEVELS``) from ``rank``'s GPU to the NIC its traffic to
    ``other``, a rank on another node, leaves by: the route's links before its first network
    link: PIX through at most one PCIe switch, PXB several, PHB through a CPU, SYS two, P2C
    through a CPU reached by C2C (Grace), PXN through another GPU (over NVLink) that reaches
    the NIC within PXB; LOC where the GPU's own links are the network's."""
    return _hops_type(topo, _to_nic(topo, rank, other))


def _to_nic(topo: Topology, rank: int, other: int) -> list[Link]:
    """The links of ``rank``'s route to ``other`` before its first network link."""
    hops: list[Link] = []
    for i in topo.route(rank, other):
        if topo.links[i].cls is LinkClass.NETWORK:
            break
        hops.append(topo.links[i])
    return hops


def _hops_type(topo: Topology, hops: list[Link]) -> str:
    """The path type of ``hops`` from a GPU to a NIC (``net_path_type``)."""
    via = [topo.device(ln.dst) for ln in hops[:-1]]
    gpus = [i for i, d in enumerate(via) if d.kind is DeviceKind.GPU]
    after = gpus[-1] + 1 if gpus else 0
    if not hops:
        kind = "LOC"
    else:
        kind = via_type(via[after:])
        if kind == "PHB" and any(ln.kind is LinkKind.C2C for ln in hops[after:]):
            kind = "P2C"  # the one CPU reached by C2C (Grace)
    if gpus and _level(kind) <= _level("PXB"):
        return "PXN"
    return kind


class NcclPaths:
    """NCCL's path types on one topology (module docstring), with the routes they read cached:
    ``fabric`` asks them of every node."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._nvl: dict[tuple[int, int], bool] = {}
        self._to_nic: dict[tuple[str, str], str] = {}
        self._peers: dict[str, set[str]] = {}
        up: dict[str, set[str]] = {}
        joined: dict[str, set[str]] = {}  # PCIe neighbours either way (a link may run one way only)
        for ln in topo.links:
            if ln.cls is LinkClass.GPU_FABRIC:
                self._peers.setdefault(ln.src, set()).add(ln.dst)
            elif ln.cls is LinkClass.PCIE:
                up.setdefault(ln.src, set()).add(ln.dst)
                joined.setdefault(ln.src, set()).add(ln.dst)
                joined.setdefault(ln.dst, set()).add(ln.src)
        self._parent = {name: next(iter(ups)) for name, ups in up.items() if len(ups) == 1}
        """A device's one PCIe neighbour, where it has one: its GPU's paths go on from there."""
        self._c2c = {ln.src for ln in topo.links if ln.kind is LinkKind.C2C}
        self._under: dict[str, int] = {}
        """Per device, the PCIe tree below a CPU it hangs in (devices joined by PCIe links
        without a CPU between them): a GPU and a NIC in different ones meet only through a CPU."""
        cpus = {d.name for d in topo.devices if d.kind is DeviceKind.CPU}
        for start in joined:
            if start in cpus or start in self._under:
                continue
            tree, todo = len(self._under), [start]
            self._under[start] = tree
            while todo:
                for nxt in joined.get(todo.pop(), ()):
                    if nxt not in cpus and nxt not in self._under:
                        self._under[nxt] = tree
                        todo.append(nxt)

    def nvl(self, a: int, b: int) -> bool:
        """Whether NCCL types ranks ``a`` and ``b``'s path NVL: GPU-fabric links only, through no
        other GPU, peer-to-peer on."""
        hit = self._nvl.get((a, b))
        if hit is None:  # NCCL_P2P_LEVEL=LOC is the one level an NVL path exceeds (shm_reason)
            hit = self._nvl[(a, b)] = self.topo.cost.p2p_level != "LOC" and self._nvl_route(a, b)
        return hit

    def _nvl_route(self, a: int, b: int) -> bool:
        topo = self.topo
        x, y = topo.ranks[a], topo.ranks[b]
        near = self._peers.get(x, set())
        if y in near or any(topo.device(d).kind is DeviceKind.NVSWITCH and y in self._peers.get(d, ())
                            for d in near):
            return True  # a link of their own, or one NVSwitch: what the route takes
        links = topo.links
        route = topo.route(a, b)
        if not route or any(links[i].cls is not LinkClass.GPU_FABRIC for i in route):
            return False
        return not any(topo.device(links[i].dst).kind is DeviceKind.GPU for i in route[:-1])

    def device_type(self, rank: int, nic: str) -> str:
        """The path type from ``rank``'s GPU to ``nic``, a NIC not its own: the route's, which
        GPUs under one PCIe device share."""
        topo = self.topo
        gpu = topo.ranks[rank]
        tree = self._under.get(gpu)
        if gpu not in self._c2c and (tree is None or tree != self._under.get(nic)):
            return "PHB"  # through a CPU at least (PHB or SYS: beyond every limit, and beyond PXN)
        key = (self._parent.get(gpu, gpu), nic)
        hit = self._to_nic.get(key)
        if hit is None:
            route = topo.device_route(gpu, nic)
            hit = self._to_nic[key] = _hops_type(topo, [topo.links[i] for i in route])
        return hit

    def intra_type(self, ranks: list[int]) -> str:
        """NCCL's ``typeIntra`` for one node's ``ranks``: LOC for one rank, NVL, NVB, or
        ``BEYOND_NVB`` (module docstring)."""
        topo = self.topo
        if len(ranks) < 2:
            return "LOC"
        if any(topo.rank_device(r).kind is not DeviceKind.GPU for r in ranks) or topo.cost.p2p_level == "LOC":
            return BEYOND_NVB  # NCCL_P2P_DISABLE: every pair through host memory, across trays too
        islands = {r: topo.fabric_island(topo.ranks[r]) for r in ranks}
        if any(i < 0 for i in islands.values()):
            return BEYOND_NVB  # a rank without NVLink closes no NVLink ring
        if all(self.nvl(a, b) and self.nvl(b, a) for a, b in zip(ranks, ranks[1:] + ranks[:1], strict=True)):
            return "NVL"  # the ranks in their order ring over NVLink (an NVSwitch's): no pair search
        nvl = {frozenset((a, b)) for i, a in enumerate(ranks) for b in ranks[i + 1:]
               if islands[a] == islands[b] and self.nvl(a, b) and self.nvl(b, a)}
        if _closes_ring(ranks, nvl):
            return "NVL"
        near = {r: {q for q in ranks if frozenset((r, q)) in nvl} for r in ranks}
        nvb = {frozenset((a, b)) for i, a in enumerate(ranks) for b in ranks[i + 1:]
               if near[a] & near[b] and not shm_pair(topo, a, b) and not shm_pair(topo, b, a)}
        return "NVB" if _closes_ring(ranks, nvl | nvb) else BEYOND_NVB

    def inter_types(self, ranks: list[int], other: int, release: Release, hopper: bool) -> tuple[str, str]:
        """NCCL's ``typeInter`` of one node's ring and tree graphs (module docstring): the NICs
        are those its ``ranks``' traffic to ``other`` (a rank on another node) leaves by."""
        topo = self.topo
        own: dict[int, tuple[str, str]] = {}  # rank -> (its NIC, the path type to it)
        for r in ranks:
            hops = _to_nic(topo, r, other)
            own[r] = (hops[-1].dst if hops else topo.ranks[r], _hops_type(topo, hops))
        c2c = release >= PXN_C2C_FROM

        def typed(kind: str) -> str:
            return "PHB" if kind == "P2C" and release < P2C_FROM else kind

        ring = tree = P2P_LEVELS[-1]
        # The nearest any rank is to its own NIC bounds what a NIC can give (no GPU is taken to
        # be nearer another NIC than that): a NIC that gives it ends the search.
        best = min((typed(kind) for _, kind in own.values()), key=_level)
        for nic in sorted({nic for nic, _ in own.values()}):
            if ring == best:
                break
            types = {r: typed(kind if mine == nic else self.device_type(r, nic)) for r, (mine, kind) in own.items()}
            near = [q for q, kind in types.items() if _level(kind) <= _level("P2C" if c2c else "PXB")]
            for r, kind in types.items():
                if _level(kind) > _level("PXN") and any(q != r and self.nvl(r, q) for q in near):
                    types[r] = "PXN"
            order = sorted(types.values(), key=_level)
            ring = min(ring, order[1] if len(order) > 1 else order[0], key=_level)
            tree = min(tree, order[0], key=_level)
        return ring, tree if hopper else ring


def ll128_enabled(intra: str, inter: str, hopper: bool, rccl: bool, release: Release) -> bool:
    """Whether NCCL runs LL128 on a graph of these path types (module docstring)."""
    intra_limit = "NVL" if rccl or release < NVB_INTRA_FROM else "NVB"
    inter_limit = "PXN" if hopper and not rccl and release >= HOPPER_PXN_FROM else "PXB"
    return _level(intra) <= _level(intra_limit) and _level(inter) <= _level(inter_limit)
