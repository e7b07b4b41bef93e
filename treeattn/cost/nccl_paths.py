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
* a rank's path to its NIC is ``net_path_type``, or PXN where a rank it reaches by NVL is
  within PXB of a NIC and its own path is further (``paths.cc``, PXN on by default); before
  2.27, which has no P2C type, a path through a CPU reached by C2C is PHB;
* a ring enters a node by one GPU and leaves it by another, so its ``typeInter`` is the
  second nearest rank's (the nearest where the node has one rank); the tree's on Hopper and
  later is the nearest rank's (one GPU to the NIC and back), before Hopper the second's
  (``BALANCED_TREE``). Over nodes, the worst.

Not modelled: GPUDirect RDMA. Where it is off (a socket transport, a NIC without peer
memory), NCCL sends every GPU-NIC path through the CPU and runs no LL128 across nodes; the
model assumes it wherever the NIC is within ``PATH_PXB``.
"""

from __future__ import annotations

from treeattn.cost.nccl_rates import shm_pair
from treeattn.topology.model import P2P_LEVELS, DeviceKind, Link, LinkClass, LinkKind, Topology
from treeattn.topology.nccl_version import Release

__all__ = ["intra_type", "inter_types", "net_path_type", "ll128_enabled", "BEYOND_NVB"]

NVB_INTRA_FROM: Release = (2, 18, 3)
"""The first release whose LL128 allows ``typeIntra`` NVB (``PATH_NVL`` before)."""
HOPPER_PXN_FROM: Release = (2, 17, 1)
"""The first release whose LL128 allows ``typeInter`` PXN from compute capability 9.0."""
P2C_FROM: Release = (2, 27, 3)
"""The first release with the P2C path type (GPU, C2C, CPU, PCIe to the NIC); PHB before."""
BEYOND_NVB = "PHB"
"""The ``intra_type`` of a node whose ranks no NVLink ring joins (PCIe or host memory)."""


def _level(kind: str) -> int:
    return P2P_LEVELS.index(kind)


def _nvl(topo: Topology, a: int, b: int) -> bool:
    """Whether NCCL types ranks ``a`` and ``b``'s path NVL: GPU-fabric links only, through no
    other GPU, peer-to-peer on."""
    links = topo.links
    route = topo.route(a, b)
    if not route or any(links[i].cls is not LinkClass.GPU_FABRIC for i in route):
        return False
    if any(topo.device(links[i].dst).kind is DeviceKind.GPU for i in route[:-1]):
        return False
    return not shm_pair(topo, a, b)


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


def intra_type(topo: Topology, ranks: list[int]) -> str:
    """NCCL's ``typeIntra`` for one node's ``ranks``: LOC for one rank, NVL, NVB, or
    ``BEYOND_NVB`` (module docstring)."""
    if len(ranks) < 2:
        return "LOC"
    if any(topo.rank_device(r).kind is not DeviceKind.GPU for r in ranks):
        return BEYOND_NVB
    if all(_nvl(topo, a, b) and _nvl(topo, b, a) for a, b in zip(ranks, ranks[1:] + ranks[:1], strict=True)):
        return "NVL"  # the ranks in their order ring over NVLink (an NVSwitch's): no pair search
    nvl = {frozenset((a, b)) for i, a in enumerate(ranks) for b in ranks[i + 1:]
           if _nvl(topo, a, b) and _nvl(topo, b, a)}
    if _closes_ring(ranks, nvl):
        return "NVL"
    near = {r: {q for q in ranks if frozenset((r, q)) in nvl} for r in ranks}
    nvb = {frozenset((a, b)) for i, a in enumerate(ranks) for b in ranks[i + 1:] if near[a] & near[b]}
    return "NVB" if _closes_ring(ranks, nvl | nvb) else BEYOND_NVB


def net_path_type(topo: Topology, rank: int, other: int) -> str:
    """NCCL's path type (``P2P_LEVELS``) from ``rank``'s GPU to the NIC its traffic to
    ``other``, a rank on another node, leaves by: the route's links before its first network
    link: PIX through at most one PCIe switch, PXB several, PHB through a CPU, SYS two, P2C
    through a CPU reached by C2C (Grace), PXN through another GPU (over NVLink) that reaches
    the NIC within PXB; LOC where the GPU's own links are the network's."""
    hops: list[Link] = []
    for i in topo.route(rank, other):
        if topo.links[i].cls is LinkClass.NETWORK:
            break
        hops.append(topo.links[i])
    via = [topo.device(ln.dst) for ln in hops[:-1]]
    gpus = [i for i, d in enumerate(via) if d.kind is DeviceKind.GPU]
    rest = via[gpus[-1] + 1:] if gpus else via
    cpus = {d.name for d in rest if d.kind is DeviceKind.CPU}
    if not hops:
        kind = "LOC"
    elif len(cpus) > 1:
        kind = "SYS"
    elif cpus:
        c2c = any(ln.kind is LinkKind.C2C for ln in hops[gpus[-1] + 1 if gpus else 0:])
        kind = "P2C" if c2c else "PHB"
    else:
        kind = "PXB" if sum(d.kind is DeviceKind.PCIE_SWITCH for d in rest) > 1 else "PIX"
    if gpus and _level(kind) <= _level("PXB"):
        return "PXN"
    return kind


def inter_types(topo: Topology, ranks: list[int], other: int, release: Release, hopper: bool) -> tuple[str, str]:
    """NCCL's ``typeInter`` of one node's ring and tree graphs: its ``ranks``' paths to the
    NICs their traffic to ``other`` (a rank on another node) leaves by, each the nearer of its
    own and PXN through a rank it reaches by NVL; the ring's the second nearest (the nearest
    for one rank), the tree's the nearest from Hopper (``hopper``) on (module docstring)."""
    own = {r: net_path_type(topo, r, other) for r in ranks}
    if release < P2C_FROM:
        own = {r: "PHB" if kind == "P2C" else kind for r, kind in own.items()}
    best = []
    for r in ranks:
        kind = own[r]
        if _level(kind) > _level("PXN") and any(
                q != r and _level(own[q]) <= _level("PXB") and _nvl(topo, r, q) for q in ranks):
            kind = "PXN"
        best.append(kind)
    best.sort(key=_level)
    ring = best[1] if len(best) > 1 else best[0]
    return ring, best[0] if hopper else ring


def ll128_enabled(intra: str, inter: str, hopper: bool, rccl: bool, release: Release) -> bool:
    """Whether NCCL runs LL128 on a graph of these path types (module docstring)."""
    intra_limit = "NVL" if rccl or release < NVB_INTRA_FROM else "NVB"
    inter_limit = "PXN" if hopper and not rccl and release >= HOPPER_PXN_FROM else "PXB"
    return _level(intra) <= _level(intra_limit) and _level(inter) <= _level(inter_limit)
