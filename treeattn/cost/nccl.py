"""A model of NCCL's own cost model: what NCCL would pick, and how long it says it takes.

Built from NCCL's published tuning constants (``src/graph/tuning.cc``, v2.19-2.30, as
summarized in /work/shared/reference/HARDWARE.md), with the bus bandwidths derived from
the topology. What we took, and what we left out:

Latency, microseconds, per protocol (LL, LL128, Simple):

    base          Tree  6.8  14    8.4      Ring  6.6  14    8.4
    hop NVLink    Tree  0.6  1.25  4        Ring  0.6  1.9   3.4
    hop PCIe      Tree  1.0  1.9   4        Ring  1.0  2.5   5.7
    hop network   Tree  5.0  8.5   14       Ring  2.7  4.0   14

* ring all-reduce: base + (2(R-1) - 2(Nn-1)) intra + 2(Nn-1) inter (R ranks, Nn nodes);
  ring all-gather / reduce-scatter: base + ((R-1) - (Nn-1)) intra + (Nn-1) inter;
  broadcast, a pipelined chain through all ranks: base + (R-Nn) intra + (Nn-1) inter;
  tree all-reduce (reduce up, broadcast down): base + 2((R/Nn - 1) intra + floor(log2 Nn) inter).
  Tree is offered for all-reduce only, as in NCCL. The intra hop is NVLink when the ranks'
  GPUs have a GPU fabric (NVLink/xGMI), else PCIe.

Bandwidth (GB/s): ``bus`` = the slowest per-rank intra-node bandwidth (when a node holds
more than one rank) and the slowest node's network bandwidth (when there is more than one
node), whichever is smaller. NCCL's per-link figures are below datasheet; we scale each
link by NCCL's figure over the datasheet one: NVLink 20.0/25 (gen 2-3, SM70-80),
20.6/25 (gen 4, SM90), 40.1/50 (gen 5, SM100); xGMI 48/64 (RCCL, gfx94x); PCIe by its
generation, 12/24/48/96 GB/s per x16 for Gen3/4/5/6 (NCCL's width x generation factor);
network links at their port speed (NCCL takes the NIC speed). So an 18-link H100 gives
18 x 20.6 = 370.8 GB/s. Per-rank intra = its GPU-fabric links summed (NCCL spreads its
channels over all of them), else its PCIe uplinks, else its loopback link. Per-node
inter = the egress of the NICs its ranks use, summed (NIC bandwidth x NICs per node).

Derating, as NCCL: ring LL x0.5 capped at llMaxBw; ring LL128 x0.92; tree all-reduce
x0.92; then tree LL x1/3.8 capped at llMaxBw; tree LL128 x7/9 on one node, x120/128
across nodes. llMaxBw by GPU generation and node count (1 / 2 / more): Volta 39/39/20.4,
Ampere 87.7/22.5/19, Hopper 141/45/35, Blackwell 282/90/70 (non-NVIDIA devices: Hopper's).
Algorithm bandwidth = bus x R/nsteps for ring (nsteps 2(R-1) all-reduce, R-1 all-gather
and reduce-scatter, R broadcast), bus x 0.5 for tree. Tree bandwidth is further scaled
by NCCL's size-dependent ``treeCorrectionFactor`` (powers of two from 64 B to 256 MiB).
time = latency + bytes / algbw. LL128 is offered only where the ranks share a GPU
fabric (NCCL enables it by default only on NVLink systems).

Left out: NVLink SHARP (NVLS) and CollNet (in-network reduction; a DGX H100 node measures
~470 GB/s bus bandwidth with NVLS, above the ~370 GB/s ring figure here), PAT, per-channel
caps (channel counts are not modelled), the ring "plateau" latency factor, and CPU-side
network overheads.

Sizes follow nccl-tests: ``nbytes`` is the buffer size for all-reduce and broadcast and the
total (all ranks') size for all-gather and reduce-scatter. busbw = algbw x 2(R-1)/R for
all-reduce, x (R-1)/R for all-gather and reduce-scatter, x 1 for broadcast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from treeattn.errors import InputError
from treeattn.topology.model import DeviceKind, Link, LinkClass, LinkKind, Topology

__all__ = [
    "Collective",
    "Algorithm",
    "Protocol",
    "NcclFabric",
    "NcclEstimate",
    "fabric",
    "predict",
    "pick",
    "busbw_factor",
    "nccl_link_bw_gbps",
]


class Collective(StrEnum):
    """Collectives the model times (nccl-tests names without ``_perf``)."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    BROADCAST = "broadcast"

    @classmethod
    def parse(cls, text: str) -> Collective:
        key = str(text).lower().replace("_", "").replace("-", "")
        try:
            return cls(key)
        except ValueError:
            choices = ", ".join(c.value for c in cls)
            raise InputError(f"unknown collective {text!r}; choose one of {choices}") from None


class Algorithm(StrEnum):
    TREE = "tree"
    RING = "ring"


class Protocol(StrEnum):
    LL = "LL"
    LL128 = "LL128"
    SIMPLE = "Simple"


_PROTOS = (Protocol.LL, Protocol.LL128, Protocol.SIMPLE)
# index 0..2 follow _PROTOS
_BASE = {Algorithm.TREE: (6.8, 14.0, 8.4), Algorithm.RING: (6.6, 14.0, 8.4)}
_HOP = {
    "nvlink": {Algorithm.TREE: (0.6, 1.25, 4.0), Algorithm.RING: (0.6, 1.9, 3.4)},
    "pci": {Algorithm.TREE: (1.0, 1.9, 4.0), Algorithm.RING: (1.0, 2.5, 5.7)},
    "net": {Algorithm.TREE: (5.0, 8.5, 14.0), Algorithm.RING: (2.7, 4.0, 14.0)},
}
# Trees are not perfectly sticking to the model for medium sizes (NCCL's words): powers of
# two of nbytes/64, from 64 B (index 0) to 256 MiB (index 22); 1.0 beyond.
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, .92, .92),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
# llMaxBw (GB/s) by GPU generation, for 1 / 2 / more nodes.
_LL_MAX = {
    "volta": (39.0, 39.0, 20.4),
    "ampere": (87.7, 22.5, 19.0),
    "hopper": (141.0, 45.0, 35.0),
    "blackwell": (282.0, 90.0, 70.0),
}
# NCCL's per-link figure over the datasheet's, by NVLink generation.
_NVLINK_SCALE = {2: 20.0 / 25.0, 3: 20.0 / 25.0, 4: 20.6 / 25.0, 5: 40.1 / 50.0}
_XGMI_SCALE = 48.0 / 64.0
_PCIE_X16 = {3: 12.0, 4: 24.0, 5: 48.0, 6: 96.0}
_PCIE_DATASHEET_X16 = {3: 15.75, 4: 31.5, 5: 63.0, 6: 126.0}


@dataclass(frozen=True, slots=True)
class NcclFabric:
    """What NCCL's model needs to know about a topology."""

    ranks: int
    nodes: int
    intra_bw_gbps: float
    """Slowest per-rank intra-node bandwidth, NCCL's figures (inf when every node holds one rank)."""
    inter_bw_gbps: float
    """Slowest node's network bandwidth (inf on one node)."""
    intra_hw: str
    """``nvlink`` or ``pci``: which hop latencies apply inside a node."""
    arch: str
    """GPU generation for llMaxBw: volta, ampere, hopper, blackwell."""
    ll128: bool
    """Whether NCCL would enable LL128 (GPU fabric present)."""

    @property
    def bus_bw_gbps(self) -> float:
        bw = min(self.intra_bw_gbps, self.inter_bw_gbps)
        return bw if math.isfinite(bw) else 0.0


@dataclass(frozen=True, slots=True)
class NcclEstimate:
    """One algorithm x protocol as NCCL's model times it."""

    algorithm: Algorithm
    protocol: Protocol
    time_us: float
    algbw_gbps: float
    """nbytes / time."""
    busbw_gbps: float
    """algbw x the nccl-tests factor of the collective."""
    latency_us: float
    """The latency term of ``time_us``."""

    def to_dict(self) -> dict:
        return {
            "algorithm": self.algorithm.value,
            "protocol": self.protocol.value,
            "time_us": self.time_us,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps,
            "latency_us": self.latency_us,
        }


def busbw_factor(collective: Collective, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: 2(n-1)/n all-reduce, (n-1)/n gather/scatter, 1 broadcast."""
    collective = Collective(collective)
    if collective is Collective.ALLREDUCE:
        return 2.0 * (ranks - 1) / ranks
    if collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return (ranks - 1) / ranks
    return 1.0


def _arch(model: str) -> str:
    m = model.upper()
    if "B200" in m or "B100" in m or "GB200" in m or "B300" in m:
        return "blackwell"
    if "A100" in m or "A800" in m or "A30" in m or "A10" in m:
        return "ampere"
    if "V100" in m:
        return "volta"
    return "hopper"


def _nvlink_gen(link: Link, arch: str) -> int:
    if link.generation is not None:
        return link.generation
    return {"volta": 2, "ampere": 3, "hopper": 4, "blackwell": 5}[arch]


def nccl_link_bw_gbps(link: Link, arch: str = "hopper") -> float:
    """A link's bandwidth as NCCL's topology search rates it (see the module docstring)."""
    if link.kind is LinkKind.NVLINK:
        return link.bw_gbps * _NVLINK_SCALE.get(_nvlink_gen(link, arch), _NVLINK_SCALE[4])
    if link.kind is LinkKind.XGMI:
        return link.bw_gbps * _XGMI_SCALE
    if link.kind is LinkKind.PCIE:
        if link.generation in _PCIE_X16:
            return link.bw_gbps * _PCIE_X16[link.generation] / _PCIE_DATASHEET_X16[link.generation]
        return link.bw_gbps * _PCIE_X16[4] / _PCIE_DATASHEET_X16[4]
    return link.bw_gbps


def fabric(topo: Topology) -> NcclFabric:
    """Summarize ``topo`` for NCCL's model: ranks, nodes, intra and inter bandwidth.

    Args:
        topo: the topology; a node is a value of ``Device.node`` holding a rank.

    Returns:
        The NcclFabric (see the module docstring for how each figure is derived).
    """
    devs = [topo.rank_device(r) for r in range(topo.num_ranks)]
    gpu_models = [d.model for d in devs if d.kind is DeviceKind.GPU]
    arch = _arch(gpu_models[0]) if gpu_models else "hopper"
    out: dict[str, list[Link]] = {}
    for ln in topo.links:
        out.setdefault(ln.src, []).append(ln)
    per_node: dict[int, list[int]] = {}
    for r, d in enumerate(devs):
        per_node.setdefault(d.node, []).append(r)
    nodes = len(per_node)
    any_fabric = all(
        d.kind is DeviceKind.GPU and any(ln.cls is LinkClass.GPU_FABRIC for ln in out.get(d.name, ())) for d in devs
    )
    # Intra-node bandwidth of each rank that shares its node.
    intra = math.inf
    for ranks in per_node.values():
        if len(ranks) < 2:
            continue
        for r in ranks:
            links = out.get(devs[r].name, [])
            pick_links = (
                [ln for ln in links if ln.cls is LinkClass.GPU_FABRIC]
                or [ln for ln in links if ln.cls is LinkClass.PCIE]
                or [ln for ln in links if ln.cls is LinkClass.LOOPBACK]
                or links
            )
            bw = sum(nccl_link_bw_gbps(ln, arch) for ln in pick_links)
            if bw > 0:
                intra = min(intra, bw)
    inter = math.inf
    if nodes > 1:
        for ranks in per_node.values():
            nics: set[str] = set()
            for r in ranks:
                nics.add(_nic_of(topo, r, out, per_node))
            bw = sum(ln.bw_gbps for nic in sorted(nics) for ln in out.get(nic, ()) if ln.cls is LinkClass.NETWORK)
            inter = min(inter, bw)
    return NcclFabric(
        ranks=topo.num_ranks,
        nodes=nodes,
        intra_bw_gbps=intra,
        inter_bw_gbps=inter,
        intra_hw="nvlink" if any_fabric else "pci",
        arch=arch,
        ll128=any_fabric,
    )


def _nic_of(topo: Topology, rank: int, out: dict[str, list[Link]], per_node: dict[int, list[int]]) -> str:
    """The device whose network links carry ``rank``'s cross-node traffic."""
    dev = topo.rank_device(rank)
    if any(ln.cls is LinkClass.NETWORK for ln in out.get(dev.name, ())):
        return dev.name
    if dev.nic:
        return dev.nic
    # Ask routing: the first network hop towards a rank on another node starts at the NIC.
    other = next(rs[0] for node, rs in sorted(per_node.items()) if node != dev.node)
    for i in topo.route(rank, other):
        ln = topo.links[i]
        if ln.cls is LinkClass.NETWORK:
            return ln.src
    return dev.name


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


def _nsteps(collective: Collective, ranks: int) -> int:
    if collective is Collective.ALLREDUCE:
        return 2 * (ranks - 1)
    if collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return ranks - 1
    return ranks


def _latency_us(fab: NcclFabric, collective: Collective, algo: Algorithm, p: int) -> float:
    r, nn = fab.ranks, fab.nodes
    intra = _HOP[fab.intra_hw][algo][p]
    inter = _HOP["net"][algo][p]
    base = _BASE[algo][p]
    if algo is Algorithm.TREE:
        return base + 2 * ((r // nn - 1) * intra + _log2i(nn) * inter)
    if collective is Collective.ALLREDUCE:
        return base + (2 * (r - 1) - 2 * (nn - 1)) * intra + 2 * (nn - 1) * inter
    if collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return base + ((r - 1) - (nn - 1)) * intra + (nn - 1) * inter
    return base + (r - nn) * intra + (nn - 1) * inter


def _algbw_gbps(fab: NcclFabric, collective: Collective, algo: Algorithm, p: int, nbytes: int) -> float:
    bus = fab.bus_bw_gbps
    ll_max = _LL_MAX[fab.arch][0 if fab.nodes == 1 else 1 if fab.nodes == 2 else 2]
    proto = _PROTOS[p]
    if algo is Algorithm.RING:
        if proto is Protocol.LL:
            bus = min(ll_max, bus * 0.5)
        elif proto is Protocol.LL128:
            bus = bus * 0.92
        bw = bus * fab.ranks / _nsteps(collective, fab.ranks)
    else:
        bus = bus * 0.92
        if proto is Protocol.LL:
            bus = min(bus / 3.8, ll_max)
        elif proto is Protocol.LL128:
            bus = bus * (7.0 / 9.0 if fab.nodes == 1 else 120.0 / 128.0)
        bw = bus * 0.5
        log_size = _log2i(nbytes >> 6)
        if log_size < len(_TREE_CORRECTION[p]):
            bw *= _TREE_CORRECTION[p][log_size]
    return bw


def predict(topo: Topology | NcclFabric, collective: Collective | str, nbytes: int) -> list[NcclEstimate]:
    """Every algorithm x protocol NCCL would consider for ``collective`` of ``nbytes``.

    Args:
        topo: the topology (or its ``fabric`` summary, to skip re-deriving it).
        collective: allreduce, allgather, reducescatter or broadcast.
        nbytes: size as nccl-tests counts it (total for all-gather and reduce-scatter).

    Returns:
        Estimates in NCCL's search order (tree before ring, LL, LL128, Simple); one
        zero-time ring/Simple entry when there is a single rank.

    Examples:
        >>> from treeattn.topology.library import resolve  # doctest: +SKIP
        >>> min(predict(resolve("dgx-h100"), "allreduce", 1 << 30), key=lambda e: e.time_us)  # doctest: +SKIP
    """
    collective = Collective.parse(collective) if not isinstance(collective, Collective) else collective
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 1:
        raise InputError(f"--bytes must be a positive integer, got {nbytes!r}")
    fab = topo if isinstance(topo, NcclFabric) else fabric(topo)
    if fab.ranks == 1:
        return [NcclEstimate(Algorithm.RING, Protocol.SIMPLE, 0.0, 0.0, 0.0, 0.0)]
    factor = busbw_factor(collective, fab.ranks)
    out: list[NcclEstimate] = []
    for algo in (Algorithm.TREE, Algorithm.RING):
        if algo is Algorithm.TREE and collective is not Collective.ALLREDUCE:
            continue
        for p, proto in enumerate(_PROTOS):
            if proto is Protocol.LL128 and not fab.ll128:
                continue
            bw = _algbw_gbps(fab, collective, algo, p, nbytes)
            if bw <= 0:
                continue
            lat = _latency_us(fab, collective, algo, p)
            t = lat + nbytes / (bw * 1e3)
            algbw = nbytes / (t * 1e3)
            out.append(NcclEstimate(algo, proto, t, algbw, algbw * factor, lat))
    if not out:
        raise InputError(f"topology gives NCCL's model no bandwidth for {collective.value} (no links between ranks?)")
    return out


def pick(topo: Topology | NcclFabric, collective: Collective | str, nbytes: int) -> NcclEstimate:
    """NCCL's choice: the estimate with the least time (ties keep NCCL's search order).

    Args:
        topo: the topology or its ``fabric`` summary.
        collective: allreduce, allgather, reducescatter or broadcast.
        nbytes: size as nccl-tests counts it.

    Returns:
        The fastest NcclEstimate.
    """
    best: NcclEstimate | None = None
    for est in predict(topo, collective, nbytes):
        if best is None or est.time_us < best.time_us:
            best = est
    assert best is not None
    return best
