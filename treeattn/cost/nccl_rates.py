"""The rates NCCL gives a topology's links, and what one transfer between two ranks moves.

NCCL's per-link figures are below datasheet; we scale each link by NCCL's figure over the
datasheet one (``nccl_link_bw_gbps``): NVLink 18/20 (gen 1, SM60), 20.0/25 (gen 2-3, SM70-80),
20.6/25 (gen 4, SM90), 40.1/50 (gen 5, SM100); xGMI 48/64 (RCCL, gfx94x). A PCIe link
NCCL rates by its generation and width alone (``topo.cc``: width x per-lane speed / 80:
3/6/12/24/48/96 GB/s per x16 for Gen1-6), whatever rate the topology measured for it;
a PCIe link without a width is scaled like the others, from the datasheet x16 figure;
network links at their port speed (NCCL takes the NIC speed). So an 18-link H100 gives
18 x 20.6 = 370.8 GB/s. A GPU's fabric links and a NIC's network links summed at those
figures are ``fabric_bw`` and ``nic_bw``, from which ``treeattn.cost.nccl_fabric`` builds
NCCL's bus bandwidths.

The same ratings time treeattn's own transfers between GPUs: ``p2p_link_gbps`` and
``transfer_gbps`` per link (what the simulator, ``treeattn.cost.simulate``, and the search's
floor drain), ``pair_rate_gbps`` per pair of ranks.

GPUs without peer-to-peer (GeForce), and GPUs whose PCIe path is longer than NCCL's P2P level
(``p2p_level``: by default no peer-to-peer through a CPU's host bridge or further apart):
NCCL's shared-memory transport carries their traffic through host memory. NCCL's estimate
rates that path at PCIe speed and picks by it; what runs moves at most ``SHM_GBPS`` of bus
bandwidth, or the host's measured ``cost.shm_gbps`` (``NcclFabric.shm_gbps``,
``shm_rate_gbps``), and each point-to-point transfer between such GPUs at most that
(``shm_pair_gbps``, which the simulator reads).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

from treeattn.cost.nccl_tuning import NET_ACHIEVED, Protocol, nccl_arch
from treeattn.topology.model import P2P_LEVELS, Device, DeviceKind, Link, LinkClass, LinkKind, Topology
from treeattn.topology.nccl_version import NEWEST, Release, nccl_release
from treeattn.topology.plausible import NVLINK_PER_LINK_GBPS, PCIE_MAX_GBPS, XGMI_PER_LINK_GBPS

__all__ = [
    "nccl_link_bw_gbps",
    "unrated_generation_note",
    "pcie_nominal_gbps",
    "pcie_over_nominal_note",
    "nic_bw",
    "fabric_bw",
    "p2p_link_gbps",
    "transfer_gbps",
    "cpu_vendor",
    "p2p_level",
    "pcie_path_type",
    "via_type",
    "node_pairs",
    "shm_pair",
    "shm_reason",
    "SHM_NO_P2P",
    "SHM_LEVEL",
    "shm_pair_gbps",
    "shm_rate_gbps",
    "shm_pairs",
    "pair_rate_gbps",
    "SHM_GBPS",
    "shm_rate_applies",
]


SHM_GBPS = 2.7
"""What NCCL's shared-memory transport moves between two GPUs of a node, one without
peer-to-peer (GeForce cards), GB/s, with NCCL's defaults: the receiving GPU's kernels load the data from
host memory over PCIe (``NCCL_SHM_USE_CUDA_MEMCPY=0``), far below the PCIe rate NCCL's
search rates the path at (paths.cc diverts it through the CPU at the links' speed). Published
all-reduce bus bandwidth with the defaults on two GPUs: 1.9 GB/s at 20 MB on 2 x RTX 5070 Ti,
PCIe 4.0 x16 with 26 GB/s copies, under LL, LL128 and Simple alike (sgl-project/sglang PR
39605); 3.9 GB/s on PCIe 3.0 x16 with one channel (NVIDIA/nccl issue 384, NCCL 2.4.8). The
model takes their geometric mean. The host sets it (NVIDIA's maintainer in NVIDIA/nccl
issues 384 and 1639: CPUs that handle two-way traffic badly; 28 GB/s on 8 RTX 5090 with 8
channels forced): a tuned machine's rate is its ``cost.shm_gbps`` (``shm_rate_gbps``), which
``calibrate --from-nccl-tests`` fits from a log of such GPUs."""
# NCCL's per-link figure (topo.h SM60-SM100_NVLINK_BW: NVLink 1 is Pascal's) over the datasheet's,
# by NVLink generation; RCCL's gfx94x xGMI link over MI300X's.
_NCCL_NVLINK_GBPS = {1: 18.0, 2: 20.0, 3: 20.0, 4: 20.6, 5: 40.1}
_NVLINK_SCALE = {gen: gbps / NVLINK_PER_LINK_GBPS[gen] for gen, gbps in _NCCL_NVLINK_GBPS.items()}
_XGMI_SCALE = 48.0 / XGMI_PER_LINK_GBPS
# topo.cc kvDictPciGen: 15, 30, 60, 120, 240, 480 (x100 Mb/s a lane) for 2.5-64 GT/s, x16 / 80.
_PCIE_X16 = {1: 3.0, 2: 6.0, 3: 12.0, 4: 24.0, 5: 48.0, 6: 96.0}
_PCIE_DATASHEET_X16 = {1: 4.0, 2: 8.0, 3: 15.75, 4: 31.5, 5: 63.0, 6: 126.0}


def _nvlink_gen(link: Link, arch: str) -> int:
    if link.generation is not None:
        return link.generation
    return {"volta": 2, "ampere": 3, "hopper": 4, "blackwell": 5}[arch]


def _named_links(links: Sequence[Link]) -> str:
    """The first of ``links`` and how many more duplex links there are ("link a->b and 3 more")."""
    first = links[0]
    more = len({frozenset((ln.src, ln.dst)) for ln in links}) - 1
    return f"link {first.src}->{first.dst}" + (f" and {more} more" if more else "")


def unrated_generation_note(topo: Topology) -> str | None:
    """A warning where links of ``topo`` name an NVLink or PCIe generation treeattn's model of
    NCCL's rating has no figure for (NVLink 1-5, PCIe 1-6): ``nccl_link_bw_gbps`` then rates them
    as NVLink 4 or from their ``bw_gbps`` as PCIe 4, and a typo there (generation 9) would go
    unnoticed; None where there is none."""
    known = {LinkKind.NVLINK: _NVLINK_SCALE, LinkKind.PCIE: _PCIE_X16}
    found: dict[tuple[LinkKind, int], list[Link]] = {}
    for ln in topo.links:
        if ln.kind in known and ln.generation is not None and ln.generation not in known[ln.kind]:
            found.setdefault((ln.kind, ln.generation), []).append(ln)
    if not found:
        return None
    parts = []
    for (kind, gen), links in sorted(found.items(), key=lambda kv: (kv[0][0].value, kv[0][1])):
        table = known[kind]
        nvlink = kind is LinkKind.NVLINK
        name, rated = ("NVLink", "rated as NVLink 4") if nvlink else ("PCIe", "rated by bw_gbps as PCIe 4")
        parts.append(f"{name} generation {gen} ({_named_links(links)}) has no figure in treeattn's model of "
                     f"NCCL ({name} {min(table)}-{max(table)} have): {rated}")
    return f"{topo.name}: " + "; ".join(parts)


def pcie_over_nominal_note(topo: Topology) -> str | None:
    """A warning where a PCIe link's ``bw_gbps`` is more than its own generation and width move
    (``pcie_nominal_gbps``): one of them is wrong, and NCCL's rating, which the model reads, takes
    the generation and width (a file's PCIe 3.0 x16 at 25 GB/s is rated 12); None where there is
    none, and on measured rates (a calibration's fit is said where it is made)."""
    if topo.cost.link_rates == "measured":
        return None
    # Generations 1 and 2 are what a VM's emulated bridges read (2.5 and 5 GT/s), and NCCL rates
    # them so too: no file's mistake. Above any PCIe link's rate: plausible says it.
    over = [ln for ln in topo.links if (nominal := pcie_nominal_gbps(ln)) is not None and ln.generation >= 3
            and 1.05 * nominal < ln.bw_gbps <= 1.05 * PCIE_MAX_GBPS]
    if not over:
        return None
    first = over[0]
    return (f"{_named_links(over)}: bw_gbps {first.bw_gbps:g} is more than PCIe {first.generation}.0 "
            f"x{first.width} moves one way ({pcie_nominal_gbps(first):g} GB/s); NCCL rates the link by its "
            f"generation and width ({nccl_link_bw_gbps(first):g} GB/s), and so does the model: correct them, or "
            "bw_gbps")


def nccl_link_bw_gbps(link: Link, arch: str = "hopper") -> float:
    """A link's bandwidth as NCCL's topology search rates it (see the module docstring)."""
    if link.kind is LinkKind.NVLINK:
        return link.bw_gbps * _NVLINK_SCALE.get(_nvlink_gen(link, arch), _NVLINK_SCALE[4])
    if link.kind is LinkKind.XGMI:
        return link.bw_gbps * _XGMI_SCALE
    if link.kind is LinkKind.PCIE:
        if link.generation in _PCIE_X16 and link.width:
            # NCCL rates a PCIe link by its generation and width alone (topo.cc: width x speed / 80).
            return _PCIE_X16[link.generation] * link.width / 16
        if link.generation in _PCIE_X16:
            return link.bw_gbps * _PCIE_X16[link.generation] / _PCIE_DATASHEET_X16[link.generation]
        return link.bw_gbps * _PCIE_X16[4] / _PCIE_DATASHEET_X16[4]
    return link.bw_gbps


def pcie_nominal_gbps(link: Link) -> float | None:
    """A PCIe link's nominal (datasheet) rate a direction, GB/s, where its generation and width
    are known (x16: 15.75/31.5/63/126 for Gen3/4/5/6; docs/hardware.md's PCIe rows): what no
    transfer over it can beat. None for other links and where either is unknown."""
    if link.kind is not LinkKind.PCIE or link.generation not in _PCIE_DATASHEET_X16 or not link.width:
        return None
    return _PCIE_DATASHEET_X16[link.generation] * link.width / 16


def nic_bw(links: Iterable[Link]) -> float:
    """A NIC's network bandwidth: its network links out."""
    return sum(ln.bw_gbps for ln in links if ln.cls is LinkClass.NETWORK)


def fabric_bw(links: Iterable[Link], arch: str) -> float:
    """A GPU's NVLink/xGMI bandwidth as NCCL rates it: its fabric links out."""
    return sum(nccl_link_bw_gbps(ln, arch) for ln in links if ln.cls is LinkClass.GPU_FABRIC)


def p2p_link_gbps(topo: Topology) -> list[float] | None:
    """Per link of ``topo``, the rate NCCL's point-to-point transfers reach on it: its own
    rating of GPU-fabric and PCIe links (``nccl_link_bw_gbps``) and ``NET_ACHIEVED`` (Simple)
    of a network port; other links at their ``bw_gbps``. None where the ranks are host CPUs
    (gloo over loopback or an emulated network: ``treeattn.cost.gloo`` times those) or the
    links' rates were measured (``cost.link_rates: measured``, a calibrated topology).

    The published sendrecv and alltoall tables (``results/published``) came out 25-36 % fast
    on datasheet rates and 4-18 % fast on these."""
    ranks = [topo.rank_device(r) for r in range(topo.num_ranks)]
    if topo.cost.link_rates == "measured" or any(d.kind is DeviceKind.HOST for d in ranks):
        return None
    arch = nccl_arch(ranks[0].model or "") if ranks else "hopper"
    net = NET_ACHIEVED[Protocol.SIMPLE]
    out = []
    for ln in topo.links:
        if ln.cls in (LinkClass.GPU_FABRIC, LinkClass.PCIE) and ln.kind in (LinkKind.NVLINK, LinkKind.XGMI,
                                                                           LinkKind.PCIE):
            out.append(nccl_link_bw_gbps(ln, arch))
        elif ln.cls is LinkClass.NETWORK:
            out.append(ln.bw_gbps * net)
        else:
            out.append(ln.bw_gbps)
    return out


def transfer_gbps(topo: Topology) -> tuple[float, ...]:
    """Per link, the rate a transfer between ranks reaches on it: ``p2p_link_gbps`` where it
    applies, else the link's ``bw_gbps`` (what the simulator and the search's floor use).

    A topology is immutable, so the rates are kept with it: a search simulates one topology
    hundreds of times, and rating 100,000 links takes a second."""
    cached = vars(topo).get(_RATES_KEY)
    if cached is None:
        rated = p2p_link_gbps(topo)
        cached = tuple(ln.bw_gbps for ln in topo.links) if rated is None else tuple(rated)
        vars(topo)[_RATES_KEY] = cached
    return cached


_RATES_KEY = "_transfer_gbps"


def _shm_rated(topo: Topology) -> bool:
    """Whether NCCL's shared-memory rate can apply: GPU ranks (host ranks are timed by
    ``treeattn.cost.gloo``) some without peer-to-peer, at NCCL's link figures or with the
    host's rate named (``cost.shm_gbps``; otherwise a calibrated topology's measured rates
    stand). Cached with the topology."""
    hit = vars(topo).get(_SHM_KEY)
    if hit is None:
        hit = (topo.cost.link_rates != "measured" or topo.cost.shm_gbps is not None) and shm_rate_applies(topo)
        vars(topo)[_SHM_KEY] = hit
    return hit


_SHM_KEY = "_shm_rated"


def node_pairs(topo: Topology) -> Iterator[tuple[int, int, int]]:
    """(node, a, b) for every ordered pair of distinct ranks on one node: the only pairs NCCL's
    shared-memory transport can carry (``shm_pair``)."""
    by_node: dict[int, list[int]] = {}
    for r in range(topo.num_ranks):
        by_node.setdefault(topo.rank_device(r).node, []).append(r)
    for node, ranks in by_node.items():
        yield from ((node, a, b) for a in ranks for b in ranks if a != b)


def shm_rate_applies(topo: Topology) -> bool:
    """Whether ``topo``'s ranks are GPUs some pairs of which NCCL's shared-memory transport
    carries (``shm_pair``), whatever the links' rates."""
    if not all(topo.rank_device(r).kind is DeviceKind.GPU for r in range(topo.num_ranks)):
        return False
    return any(shm_pair(topo, a, b) for _, a, b in node_pairs(topo))


def cpu_vendor(topo: Topology) -> str:
    """``amd``, ``intel`` or ``other``, as NCCL reads its host's CPU, from the CPU devices'
    models (``EPYC``/``Ryzen``/``Threadripper``/``AMD``, ``Xeon``/``Intel``); a topology without
    CPU models: ``intel``."""
    models = " ".join(d.model.upper() for d in topo.devices if d.kind is DeviceKind.CPU)
    if any(name in models for name in ("EPYC", "RYZEN", "THREADRIPPER", "AMD")):
        return "amd"
    if "XEON" in models or "INTEL" in models or not models:
        return "intel"
    return "other"


_PXB_BY_DEFAULT_FROM = (2, 23, 4)
"""The first NCCL release whose default P2P level is PXB on every CPU (AMD with at most two
GPUs excepted); before it, "use P2P whenever we can" (SYS) except on Intel, Zhaoxin and ARM
CPUs, PXB (``src/graph/paths.cc`` ``ncclTopoCheckP2p`` at tags v2.22.3-1 and v2.23.4-1)."""


def p2p_level(topo: Topology, node: int, release: Release | None = None) -> str:
    """The farthest path type (``P2P_LEVELS``) over which NCCL connects two GPUs of ``node``
    peer-to-peer: ``cost.p2p_level`` (what ``NCCL_P2P_LEVEL`` sets; LOC: none, as
    ``NCCL_P2P_DISABLE=1``) where given, else
    NCCL's default at ``release`` (by default the topology's, ``cost.nccl_version``, else the
    newest): from 2.23.4 PXB ("don't use P2P across CPU Host Bridges and further apart"), SYS
    on an AMD x86 host with at most two GPUs (the GPUs of the communicator on that host, here
    the node's ranks); before, SYS on AMD hosts and PXB on others (``_PXB_BY_DEFAULT_FROM``)."""
    if topo.cost.p2p_level is not None:
        return topo.cost.p2p_level
    if release is None:
        release = NEWEST if topo.cost.nccl_version is None else nccl_release(topo.cost.nccl_version)
    amd = cpu_vendor(topo) == "amd"
    if release < _PXB_BY_DEFAULT_FROM:
        return "SYS" if amd else "PXB"
    if amd and sum(topo.rank_device(r).node == node for r in range(topo.num_ranks)) <= 2:
        return "SYS"
    return "PXB"


def pcie_path_type(topo: Topology, a: int, b: int) -> str:
    """NCCL's type (``P2P_LEVELS``) of the PCIe route between ranks ``a`` and ``b`` of one
    node: SYS where it crosses two CPU sockets, PHB through one, PXB through several PCIe
    switches, else PIX (``src/graph/paths.cc`` ``ncclTopoSetPaths``)."""
    links = topo.links
    return via_type([topo.device(links[i].dst) for i in topo.route(a, b)[:-1]])


def via_type(via: Sequence[Device]) -> str:
    """NCCL's type of a PCIe path through the devices ``via`` (its ends left out): SYS through
    two CPU sockets, PHB through one, PXB through several PCIe switches, else PIX."""
    cpus = {d.name for d in via if d.kind is DeviceKind.CPU}
    if cpus:
        return "SYS" if len(cpus) > 1 else "PHB"
    return "PXB" if sum(d.kind is DeviceKind.PCIE_SWITCH for d in via) > 1 else "PIX"


def _gpu_between(topo: Topology, a: str, b: str) -> bool:
    """Whether a GPU has GPU-fabric links of its own to both devices ``a`` and ``b``: NCCL's
    NVB path (``ncclTopoComputePaths`` routes through a GPU only as one hop), which a chain of
    NVLink bridges (0-1-2-3: 0 and 3) is not."""
    def peers(name: str) -> set[str]:
        return {ln.dst for ln in topo.links if ln.src == name and ln.cls is LinkClass.GPU_FABRIC
                and topo.device(ln.dst).kind is DeviceKind.GPU}
    return bool(peers(a) & peers(b))


SHM_NO_P2P = "no-p2p"
"""``shm_reason``: a GPU without peer-to-peer at either end of a pair no GPU fabric joins."""
SHM_LEVEL = "level"
"""``shm_reason``: a path longer than NCCL's P2P level (``p2p_level``)."""


def shm_reason(topo: Topology, a: int, b: int) -> str | None:
    """Why rank ``a``'s transfers to rank ``b`` go through NCCL's shared-memory transport, or
    None where they do not: ``SHM_LEVEL``, GPUs of one node whose path is longer than NCCL's
    P2P level (``p2p_level``), or ``SHM_NO_P2P``, not joined by a GPU fabric, one without
    peer-to-peer (routing bounces their copies through the CPU; checked before the level, so
    such a pair has this reason whatever the level). The path's type (``P2P_LEVELS``): NVL
    over the GPU fabric alone, NVB where NVLink or xGMI joins them only through one other GPU
    (DGX-1's hybrid cube-mesh, where routing takes PCIe; ``_gpu_between``), else the PCIe
    route's (``pcie_path_type``; NCCL diverts a path beyond its level through the CPU, which
    such a route already crosses). A GPU fabric pair needs no peer access over PCIe: only
    the level sends it through host memory."""
    da, db = topo.rank_device(a), topo.rank_device(b)
    if (a == b or da.kind is not DeviceKind.GPU or db.kind is not DeviceKind.GPU or da.node != db.node
            or da.node < 0):
        return None
    links = topo.links
    route = topo.route(a, b)
    island = topo.fabric_island(da.name)
    if all(links[i].cls is LinkClass.GPU_FABRIC for i in route):
        kind = "NVL"
    elif island >= 0 and island == topo.fabric_island(db.name) and _gpu_between(topo, da.name, db.name):
        kind = "NVB"
    elif not (da.p2p and db.p2p):
        return SHM_NO_P2P
    elif any(links[i].cls is not LinkClass.PCIE for i in route):
        return None  # the network's transports
    else:
        kind = pcie_path_type(topo, a, b)
    if kind in ("NVL", "NVB") and topo.cost.p2p_level is None:
        return None  # NCCL's defaults (PXB or SYS) reach past NVLink
    return SHM_LEVEL if P2P_LEVELS.index(kind) > P2P_LEVELS.index(p2p_level(topo, da.node)) else None


def shm_pair(topo: Topology, a: int, b: int) -> bool:
    """Whether rank ``a``'s transfers to rank ``b`` go through NCCL's shared-memory transport
    (``shm_reason`` gives one)."""
    return shm_reason(topo, a, b) is not None


def shm_pair_gbps(topo: Topology, a: int, b: int) -> float:
    """The most a transfer from rank ``a`` to rank ``b`` moves through NCCL's shared-memory
    transport: ``shm_rate_gbps`` where it goes through it (``shm_pair``) and the rate applies
    (``_shm_rated``); else inf (other routes, across nodes through a NIC, have their links'
    rates)."""
    return shm_rate_gbps(topo) if _shm_rated(topo) and shm_pair(topo, a, b) else math.inf


def shm_pairs(topo: Topology) -> int:
    """How many ordered rank pairs move through NCCL's shared-memory transport (``shm_pair_gbps``)."""
    if not _shm_rated(topo):
        return 0
    return sum(shm_pair_gbps(topo, a, b) < math.inf for _, a, b in node_pairs(topo))


def shm_rate_gbps(topo: Topology) -> float:
    """What NCCL's shared-memory transport moves between two GPUs without peer-to-peer on
    ``topo``'s host: its ``cost.shm_gbps`` (measured or written), else ``SHM_GBPS``."""
    return topo.cost.shm_gbps or SHM_GBPS


def pair_rate_gbps(topo: Topology, a: int, b: int) -> float:
    """What one transfer from rank ``a`` to rank ``b`` moves alone on its route (inf for a
    rank to itself), as the simulator and the search's floor drain it: the least of its
    links' ``transfer_gbps`` and per-flow caps (``flow_gbps``) and of ``shm_pair_gbps``;
    before the cap NCCL's channels put on a send of a given size (``nccl_p2p``) and before
    sharing links with other flows."""
    rates, links = transfer_gbps(topo), topo.links
    route = topo.route(a, b)
    return min(min((min(rates[i], links[i].flow_cap_gbps) for i in route), default=math.inf),
               shm_pair_gbps(topo, a, b))
