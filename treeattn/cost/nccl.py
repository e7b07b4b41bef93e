"""A model of NCCL's own cost model: what NCCL would pick, and how long that takes.

Built from NCCL's published tuning constants (``src/graph/tuning.cc``, v2.19-2.30; the
figures and where they come from are in docs/nccl-model.md), with the bus bandwidths derived
from the topology (``treeattn.cost.nccl_fabric``: how, and the routes that cap them). Each
estimate carries two times: ``rank_us``, NCCL's own estimate, which it picks by, and
``time_us``, what the algorithm achieves (what nccl-tests measures), which differs where the
published record shows NCCL's estimate off (below). The constants are in
``treeattn.cost.nccl_tuning``, NCCL's ratings of the links in ``treeattn.cost.nccl_rates``,
the environment's restrictions in ``treeattn.cost.nccl_env``. What we took, and what we left out:

Latency, per protocol (the base and per-hop figures: ``nccl_tuning``):

* ring all-reduce: base + (2(R-1) - 2(Nn-1)) intra + 2(Nn-1) inter (R ranks, Nn nodes);
  ring all-gather / reduce-scatter: base + ((R-1) - (Nn-1)) intra + (Nn-1) inter;
  broadcast and reduce, a pipelined chain through all ranks: base + (R-Nn) intra + (Nn-1) inter;
  NCCL's estimate of them (which picks) across nodes with two or more NICs a node, where its
  ring graph's channels differ: base + R network hops (Simple: the tree's; ``_chain_net_hop_us``);
  tree all-reduce (reduce up, broadcast down): base + 2((R/Nn - 1) intra + floor(log2 Nn) inter).
  Tree is offered for all-reduce only, as in NCCL. The intra hop is NVLink when the ranks'
  GPUs have a GPU fabric (NVLink/xGMI), else PCIe. In what runs a hop is never faster than its
  route's own latency (the topology's links: a bounce through host memory, a long network
  path); NCCL's estimate knows its constants only (its graph's ``latencyInter`` is a network
  plugin's figure, 0 for InfiniBand).

What is not charged here: the topology's per-message ``cost.overhead_us``. NCCL's
constants are fitted to nccl-tests' back-to-back loop, where the host's cost of issuing a
call overlaps the previous call; the simulator (``treeattn.cost.simulate``) adds one
``overhead_us`` per collective call, as it charges one per message of a plan. Ranks on
``host`` devices (CPU-only runs, gloo) are not timed by this model at all in the
simulator (``treeattn.cost.gloo``).

Derating, as NCCL: ring LL x0.5 capped at llMaxBw; ring LL128 x0.92; tree all-reduce x0.92;
then tree LL x1/3.8 capped at llMaxBw; tree LL128 x7/9 on one node, x120/128 across nodes; a
tree with one GPU a node x0.85 (``maxTreePattern == NCCL_TOPO_PATTERN_TREE``, the pattern
NCCL's search takes with one GPU a node; its fallback to that pattern on Hopper when a
balanced tree is not found in time is not modelled). Ring LL128, tree and tree LL128 are
also capped at the ring/tree graph's channels (``nccl_channels.graph_channels``: 8 on DGX
H100 nodes with 8 NICs) times NCCL's per-channel figure (``perChMaxRingLL128Bws``,
``perChMaxTreeBws``, ``perChMaxTreeLL128Bws`` by GPU generation for 1 / 2 / more nodes; on 4
or more H100 nodes the tree's 8 x 36 GB/s and its LL128's 8 x 29 bind), in NCCL's estimate
and in what runs (the figures by GPU generation and node count, and llMaxBw's:
``nccl_tuning``).
Algorithm bandwidth = bus x R/nsteps for ring (nsteps 2(R-1) all-reduce, R-1 all-gather
and reduce-scatter, R broadcast and reduce), bus x 0.5 for tree, whose bus on two nodes is
its intra-node chain's up to twice the network's (``NcclFabric.tree_bus_bw_gbps``: each byte
crosses the network once each way; NCCL's search and estimate rate it so), in NCCL's estimate
and in what runs. Tree bandwidth is further scaled
by NCCL's size-dependent ``treeCorrectionFactor`` (powers of two from 64 B to 256 MiB).
time = latency + bytes / algbw. LL128 is offered only where the ranks share a GPU
fabric (NCCL enables it by default only on NVLink systems).

NVLink SHARP: on Hopper and newer GPUs whose node shares one NVSwitch fabric, all-reduce
also considers NVLS (one node) and NVLSTree (several), NCCL's estimate and what runs as in
``treeattn.cost.nvls``. A node is NCCL's: one NVLink domain spanning machines (GB200 NVL72,
multi-node NVLink) is one node.

Picking (NCCL's estimate only): across nodes a ring's intra-node steps cost at least the
network post overhead (``getNetOverhead``: 1 us on Intel hosts, 2 on AMD, x3 for Simple);
with one rank per node the network hop is the tree's figure; llMaxBw across nodes follows
the hosts' CPU (NCCL's rows: AMD hosts 22.5 / 19, others 39 / 20.4 GB/s on 2 / more nodes).

Achieved (``time_us``): NCCL's formulas without the post overhead, and across nodes each
protocol moves the network at ``NET_ACHIEVED`` of NCCL's figure (Simple 0.94: the 46-48 GB/s
NCCL's maintainers quote for a 400 Gb/s NIC; LL128 0.6, measured on the corpus); on one node
of 8 MI300X/MI325X RCCL's rings move ``RCCL_XGMI_ACHIEVED`` (0.94, measured) of RCCL's xGMI
rating. On Ampere
each channel a call runs on beyond its first adds ``AMPERE_CHANNEL_US`` (fitted on published
A100 tables; NCCL's estimate does not see it). A one-node NVLink ring all-reduce, all-gather or
reduce-scatter with Simple ends ``ring_step_tail_us`` late (``RING_STEP_TAIL_US``: about 0.4
of a ring step at 100 us steps, measured on the corpus, its cause not found).
``NCCL_ALGO``, ``NCCL_PROTO`` and ``NCCL_NVLS_ENABLE=0`` restrict the pick (``nccl_env.allowed_by_env``).

Channels (``treeattn.cost.nccl_channels``): NCCL's figures are those of all its channels;
below a size NCCL runs a ring or tree on fewer (``run_channels``), and what runs moves that
share of the bandwidth; NCCL's estimate does not see it (RCCL, on AMD GPUs, left out: it runs
small all-reduces through its MSCCL kernels). A multi-node ring all-reduce with
Simple has NCCL's "plateau" latency, x1.4 (x1.9 on Volta) once each channel and rank holds
64 bytes, in NCCL's estimate and in what runs.

RCCL (AMD GPUs): one node of 8 GPUs with an xGMI link per pair runs an all-reduce through
RCCL's MSCCL all-pairs algorithm wherever one of its algorithm files covers the size
(``treeattn.cost.msccl``: 1 KiB to 16 MiB; ``Algorithm.ALLPAIRS``, picked ahead of the
tuner's ring and tree, not restricted by ``NCCL_ALGO``; ``RCCL_MSCCL_ENABLE=0`` turns it off);
before RCCL 2.21 only where every rank has its own process (``pick``'s ``ranks_per_process``
and ``rccl_release``; ``msccl.single_process_blocks``).

GPUs without peer-to-peer (GeForce): what runs stays under the shared-memory transport's rate
(``NcclFabric.shm_gbps``; ``treeattn.cost.nccl_rates``), which NCCL's estimate does not see.

NCCL releases: NVLS's latencies and NCCL's NVLS/NVLSTree estimate (``treeattn.cost.nvls``),
and NCCL's estimate of ring LL and LL128 (before 2.21.5 LL at a quarter of the graph's
bandwidth, not half, Hopper's llMaxBw Ampere's; before 2.23.4 LL128 at 0.7 with one rank per
node; before 2.23.4 Tree/Simple at no base and 28 us a hop, a ring all-reduce's network steps
2 x nodes, and with one rank a node a ring's own network hop: ``nccl_tuning.OLD_LATENCY_BEFORE``,
which NVIDIA/nccl issue 1519's printed table of 2 x 8 H100 on NCCL 2.20 matches to the 0.1 us),
follow ``NcclFabric.nccl_release``: the topology's ``cost.nccl_version``, else the
newest release the model follows (``check-model`` sets each published table's). The
estimate only ranks the choices; what runs, and every other figure, is NCCL 2.30's.

Left out: CollNet (in-network reduction over InfiniBand SHARP), PAT, NVLS for all-gather and
reduce-scatter, and the latency of an EFA or RoCE network beyond NCCL's constants.
"""

from __future__ import annotations

import dataclasses
import math

from treeattn.cost import msccl
from treeattn.cost.nccl_channels import run_channels
from treeattn.cost.nccl_env import allowed_by_env, msccl_single_process
from treeattn.cost.nccl_fabric import NcclFabric, fabric
from treeattn.cost.nccl_tuning import (
    _BASE,
    _HOP,
    _HOPPER_LL_MAX,
    _LL_MAX,
    _NET_OVERHEAD_US,
    _OLD_TREE_SIMPLE_BASE,
    _OLD_TREE_SIMPLE_HOP,
    _PER_CH_RING_LL128,
    _PER_CH_TREE,
    _PER_CH_TREE_LL128,
    _PROTOS,
    _RING_LL128_ONE_PER_NODE,
    _RING_LL_SHARE,
    _TREE_CORRECTION,
    AMPERE_CHANNEL_US,
    NET_ACHIEVED,
    OLD_LATENCY_BEFORE,
    RCCL_XGMI_ACHIEVED,
    RING_STEP_TAIL_POWER,
    RING_STEP_TAIL_US,
    Algorithm,
    Collective,
    NcclEstimate,
    Protocol,
    busbw_factor,
)
from treeattn.cost.nvls import nvls_allreduce, nvls_channels, nvls_reduces
from treeattn.errors import InputError
from treeattn.topology.model import Topology
from treeattn.topology.nccl_version import NEWEST, Release, by_release

__all__ = [
    "predict",
    "pick",
    "nvls_offered",
    "chain_call_latency_us",
    "run_channel_count",
    "ring_step_tail_us",
    "topo_rccl_without_ll128",
    "RCCL_LL128_GFX90A_ONLY_TO",
]


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


def _nsteps(collective: Collective, ranks: int) -> int:
    if collective is Collective.ALLREDUCE:
        return 2 * (ranks - 1)
    if collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return ranks - 1
    return ranks


def _old_estimate(fab: NcclFabric, tuner: bool) -> bool:
    """Whether NCCL's estimate (``tuner``) of ``fab``'s release takes the latencies of before 2.23.4."""
    return tuner and fab.nccl_release < OLD_LATENCY_BEFORE


def _old_tree_simple(fab: NcclFabric, tuner: bool, algo: Algorithm, p: int) -> bool:
    """Whether NCCL's estimate times this tree with Simple by the figures of before 2.23.4."""
    return _old_estimate(fab, tuner) and algo is Algorithm.TREE and _PROTOS[p] is Protocol.SIMPLE


def _hop_us(fab: NcclFabric, algo: Algorithm, p: int, tuner: bool = False) -> tuple[float, float]:
    """One hop's latency inside a node and across nodes, for an algorithm x protocol: what runs,
    or NCCL's estimate (``tuner``) of the fabric's release, which knows its constants only (the
    graph's ``latencyInter``, a network plugin's figure, is 0 for InfiniBand and sockets)."""
    if _old_tree_simple(fab, tuner, algo, p):
        return _OLD_TREE_SIMPLE_HOP, _OLD_TREE_SIMPLE_HOP
    intra = _HOP[fab.intra_hw][algo][p]
    # One rank per node exposes the network latency whole: NCCL charges the tree's figure
    # (from 2.23.4; before, in its estimate, the ring's own).
    one_per_node = fab.ranks == fab.nodes and not _old_estimate(fab, tuner)
    net = _HOP["net"][Algorithm.TREE if one_per_node else algo][p]
    if tuner:
        return intra, net
    # What runs: a hop is never faster than its route's own latency (a bounce through host
    # memory, a long network path).
    return max(intra, fab.intra_route_us), max(net, fab.inter_route_us)


def _chain_net_hop_us(p: int, old: bool = False) -> float:
    """The hop NCCL's estimate charges each of a multi-node broadcast's or reduce's ring steps
    (tuning.cc ncclTopoTuneModel, v2.19-2.30: ``nsteps * hwLat[NET][RING][p]``, Simple taking
    the tree's network figure, "waiting for proper chunk modeling"; no route latency and no
    ``latencyInter``, which NCCL adds to its other network hops only). NCCL charges this when
    the ring graph's channels differ (``graphs[RING]->sameChannels == 0``), which its search
    (search.cc ncclTopoCompute: a first pass retried with ``sameChannels = 0`` when rings
    replaying one order fall short of the system's bandwidth) leaves where each channel
    enters a node by its own NIC (``NcclFabric.nics`` >= 2; multi-NIC logs print
    ``sameChannels 0``: NVIDIA/nccl issues 601 and 1189). With the same channels NCCL charges
    one hop: not modelled."""
    if _PROTOS[p] is Protocol.SIMPLE:
        return _OLD_TREE_SIMPLE_HOP if old else _HOP["net"][Algorithm.TREE][p]
    return _HOP["net"][Algorithm.RING][p]


def _latency_us(fab: NcclFabric, collective: Collective, algo: Algorithm, p: int, tuner: bool = True) -> float:
    """Latency of one algorithm x protocol: NCCL's tuner's (``tuner``), or what runs, which
    leaves out the per-step network post overhead NCCL adds to multi-node rings."""
    r, nn = fab.ranks, fab.nodes
    old = _old_estimate(fab, tuner)
    intra, inter = _hop_us(fab, algo, p, tuner)
    base = _OLD_TREE_SIMPLE_BASE if _old_tree_simple(fab, tuner, algo, p) else _BASE[algo][p]
    if algo is Algorithm.TREE:
        return base + 2 * ((r // nn - 1) * intra + _log2i(nn) * inter)
    if tuner and nn > 1 and fab.nics > 1 and collective in (Collective.BROADCAST, Collective.REDUCE):
        # NCCL's estimate of a multi-node broadcast or reduce whose ring channels differ.
        return base + _nsteps(collective, r) * _chain_net_hop_us(p, old)
    if tuner and nn > 1 and collective not in (Collective.BROADCAST, Collective.REDUCE):
        # A multi-node ring still posts every step to the network proxy (getNetOverhead).
        intra = max(intra, _NET_OVERHEAD_US[fab.cpu] * (3 if _PROTOS[p] is Protocol.SIMPLE else 1))
    if collective is Collective.ALLREDUCE:
        net_steps = 0 if nn == 1 else 2 * nn if old else 2 * (nn - 1)  # before 2.23.4 NCCL counted 2 x nodes
        return base + (2 * (r - 1) - net_steps) * intra + net_steps * inter
    if collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return base + ((r - 1) - (nn - 1)) * intra + (nn - 1) * inter
    return base + (r - nn) * intra + (nn - 1) * inter


def chain_call_latency_us(fab: NcclFabric, algo: Algorithm, protocol: Protocol) -> float:
    """What one broadcast or reduce adds to a run of them issued back to back (nccl-tests'
    timed loop): its pipelined chain lets each rank end its part once it has passed the data
    on, and its next call starts then, while the chain's far end still works on the last one,
    so a call costs the base latency and the chain's slowest hop, not every hop of it
    (``_latency_us``, a single call's)."""
    p = _PROTOS.index(protocol)
    intra, inter = _hop_us(fab, algo, p)
    return _BASE[algo][p] + (max(intra, inter) if fab.nodes > 1 else intra)


def _achieved(fab: NcclFabric, p: int) -> NcclFabric:
    """The fabric as a protocol drives it: across nodes the network at ``NET_ACHIEVED`` of
    NCCL's figure, on one node of 8 AMD GPUs (gfx942) RCCL's ring over xGMI at
    ``RCCL_XGMI_ACHIEVED`` of RCCL's (see the module docstring)."""
    if fab.nodes == 1 and fab.ranks == 8 and fab.rccl and not fab.gfx90a and fab.intra_hw == "nvlink":
        return dataclasses.replace(fab, intra_bw_gbps=fab.intra_bw_gbps * RCCL_XGMI_ACHIEVED)
    if fab.nodes == 1 or not math.isfinite(fab.inter_bw_gbps):
        return fab
    return dataclasses.replace(fab, inter_bw_gbps=fab.inter_bw_gbps * NET_ACHIEVED[_PROTOS[p]])


def _plateau(fab: NcclFabric, collective: Collective, algo: Algorithm, p: int, nbytes: int) -> float:
    """NCCL's "plateau effect of ring" (tuning.cc ncclTopoGetAlgoTime): a multi-node ring
    all-reduce with Simple of at least 64 bytes per channel and rank has x1.4 the latency
    (x1.9 before Ampere)."""
    if (algo is not Algorithm.RING or _PROTOS[p] is not Protocol.SIMPLE or fab.nodes < 2
            or collective is not Collective.ALLREDUCE or nbytes < 64 * max(fab.channels, 1) * fab.ranks):
        return 1.0
    return 1.9 if fab.arch == "volta" else 1.4


def run_channel_count(fab: NcclFabric, algo: Algorithm, protocol: Protocol, nbytes: int) -> int | None:
    """Channels NCCL runs a call of ``nbytes`` on (enqueue.cc topoGetAlgoInfo): a ring or tree
    drops channels below its thread thresholds (``nccl_channels.run_channels``), NVLS and
    NVLSTree run on the communicator's NVLS channels; None where the model does not know them
    (no channel count for the fabric, RCCL's MSCCL files)."""
    if algo in (Algorithm.NVLS, Algorithm.NVLS_TREE):
        return nvls_channels(fab.arch, fab.ranks, fab.nodes, fab.inter_bw_gbps, fab.nccl_release)
    if algo not in (Algorithm.RING, Algorithm.TREE) or fab.channels <= 0:
        return None
    return run_channels(fab.channels, protocol.value, nbytes, fab.ranks, algo is Algorithm.RING, fab.ring_gbps)


def ring_step_tail_us(fab: NcclFabric, collective: Collective, time_us: float) -> float:
    """What a one-node NVLink ring with Simple adds to a call NCCL's formulas time at
    ``time_us`` (``RING_STEP_TAIL_US``); 0 elsewhere: several nodes, PCIe or shared memory
    between the GPUs, AMD's GPUs, broadcast and reduce."""
    if (fab.nodes != 1 or fab.intra_hw != "nvlink" or fab.rccl or fab.shm_gbps > 0 or time_us <= 0
            or collective not in (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.REDUCESCATTER)):
        return 0.0
    step_us = time_us / _nsteps(collective, fab.ranks)
    return RING_STEP_TAIL_US * (step_us / 100.0) ** RING_STEP_TAIL_POWER


def _channels_run(fab: NcclFabric, algo: Algorithm, protocol: Protocol, nbytes: int) -> tuple[float, float]:
    """The share of NCCL's channels a ring or tree of ``nbytes`` runs on (nccl_channels), and
    what the channels beyond its first add on Ampere (``AMPERE_CHANNEL_US``)."""
    nc = run_channel_count(fab, algo, protocol, nbytes)
    if nc is None:
        return 1.0, 0.0
    return nc / fab.channels, AMPERE_CHANNEL_US * (nc - 1) if fab.arch == "ampere" else 0.0


def _algbw_gbps(fab: NcclFabric, collective: Collective, algo: Algorithm, p: int, nbytes: int,
                release: Release = NEWEST) -> float:
    """Algorithm bandwidth by tuning.cc's figures of ``release`` (NCCL's estimate: the fabric's
    release; what runs: ``NEWEST``)."""
    bus = fab.tree_bus_bw_gbps if algo is Algorithm.TREE else fab.bus_bw_gbps
    scale = 0 if fab.nodes == 1 else 1 if fab.nodes == 2 else 2
    # One node: by GPU generation; several: by the hosts' CPU (AMD rows of Ampere, else Volta's).
    row = fab.arch if fab.nodes == 1 else "ampere" if fab.cpu == "amd" else "volta"
    ll_max = (by_release(_HOPPER_LL_MAX, release) if row == "hopper" else _LL_MAX[row])[scale]
    proto = _PROTOS[p]
    # tuning.cc's per-channel caps (graph channels x perChMax*), none when the graph is unknown.
    gch = fab.graph_channels or math.inf
    if algo is Algorithm.RING:
        if proto is Protocol.LL:
            share, other = by_release(_RING_LL_SHARE, release)
            quarter = fab.nodes > 1 or collective in (Collective.ALLREDUCE, Collective.REDUCE)
            bus = min(ll_max, bus * (share if quarter else other))
        elif proto is Protocol.LL128:
            one_per_node = fab.ranks < 2 * fab.nodes
            bus = min(bus * (by_release(_RING_LL128_ONE_PER_NODE, release) if one_per_node else 0.92),
                      gch * _PER_CH_RING_LL128[fab.arch][scale])
        bw = bus * fab.ranks / _nsteps(collective, fab.ranks)
    else:
        bus = min(bus * 0.92, gch * _PER_CH_TREE[fab.arch][scale])
        if proto is Protocol.LL:
            bus = min(bus / 3.8, ll_max)
        elif proto is Protocol.LL128:
            bus = min(bus * (7.0 / 9.0 if fab.nodes == 1 else 120.0 / 128.0), gch * _PER_CH_TREE_LL128[fab.arch][scale])
        if fab.ranks == fab.nodes:
            bus *= 0.85  # one GPU a node: the search's plain tree pattern (NCCL_TOPO_PATTERN_TREE)
        bw = bus * 0.5
        log_size = _log2i(nbytes >> 6)
        if log_size < len(_TREE_CORRECTION[p]):
            bw *= _TREE_CORRECTION[p][log_size]
    return bw


def predict(topo: Topology | NcclFabric, collective: Collective | str, nbytes: int,
            elem_bytes: int = 4) -> list[NcclEstimate]:
    """Every algorithm x protocol NCCL would consider for ``collective`` of ``nbytes``.

    Args:
        topo: the topology (or its ``fabric`` summary, to skip re-deriving it).
        collective: allreduce, allgather, reducescatter, broadcast or reduce.
        nbytes: size as nccl-tests counts it (total for all-gather and reduce-scatter).
        elem_bytes: the element's size (nccl-tests' float: 4); RCCL's MSCCL counts elements.

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
            if proto is Protocol.LL128 and not (fab.tree_ll128 if algo is Algorithm.TREE else fab.ll128):
                continue
            bw = _algbw_gbps(fab, collective, algo, p, nbytes, fab.nccl_release)
            if bw <= 0:
                continue
            plateau = _plateau(fab, collective, algo, p, nbytes)
            tuned = plateau * _latency_us(fab, collective, algo, p) + nbytes / (bw * 1e3)
            lat = plateau * _latency_us(fab, collective, algo, p, tuner=False)
            share, channel_us = _channels_run(fab, algo, proto, nbytes)
            achieved = _algbw_gbps(_achieved(fab, p), collective, algo, p, nbytes) * share
            if fab.shm_gbps > 0:
                achieved = min(achieved, fab.shm_gbps / factor)
            t = lat + nbytes / (achieved * 1e3) + channel_us
            if algo is Algorithm.RING and proto is Protocol.SIMPLE:
                t += ring_step_tail_us(fab, collective, t)
            algbw = nbytes / (t * 1e3)
            out.append(NcclEstimate(algo, proto, t, algbw, algbw * factor, lat, None if tuned == t else tuned))
    if collective is Collective.ALLREDUCE and fab.nvls_gbps > 0:
        got = nvls_allreduce(fab.arch, fab.ranks, fab.nodes, fab.nvls_gbps, fab.inter_bw_gbps, nbytes,
                             NET_ACHIEVED[Protocol.SIMPLE], fab.nccl_release)
        if got is not None:
            name, nccl_us, t, lat = got
            algbw = nbytes / (t * 1e3)
            out.append(NcclEstimate(Algorithm(name), Protocol.SIMPLE, t, algbw, algbw * factor, lat, nccl_us))
    if collective is Collective.ALLREDUCE and fab.allpairs_gbps > 0:
        got = msccl.allpairs_allreduce(fab.ranks, fab.allpairs_gbps, nbytes, elem_bytes)
        if got is not None:
            proto, t, lat = got
            algbw = nbytes / (t * 1e3)
            out.append(NcclEstimate(Algorithm.ALLPAIRS, Protocol(proto), t, algbw, algbw * factor, lat))
    if not out:
        raise InputError(f"topology gives NCCL's model no bandwidth for {collective.value} (no links between ranks?)")
    return out


RCCL_LL128_GFX90A_ONLY_TO: Release = (2, 21, 5)
"""The newest RCCL read to enable LL128 by default on gfx90a GPUs only (ROCm/rccl
``src/graph/tuning.cc``, "Enable LL128 by default only on gfx90a with available tuning table",
rocm-6.2.0's 2.20.5 to 0cbce2a7's 2.21.5 for ROCm 6.3.0; and there only where the node matched
one of its platform models with ``ll128Enabled=1``, 16-GCD MI250X nodes, or under
``RCCL_LL128_FORCE_ENABLE=1``): none on MI300X/MI325X (gfx942). A later RCCL allows gfx942 and
gfx950 with the same ``ll128Enabled``, which no 8-GPU node model read here sets; not followed."""


def topo_rccl_without_ll128(topo: Topology | NcclFabric, rccl_release: Release | None) -> bool:
    """Whether RCCL ``rccl_release`` (None: unknown, taken as the 2.21 series, as
    ``treeattn.cost.msccl`` takes it) leaves LL128 off on ``topo``'s AMD GPUs."""
    fab = topo if isinstance(topo, NcclFabric) else fabric(topo)
    return (fab.rccl and not fab.gfx90a
            and (rccl_release is None or rccl_release <= RCCL_LL128_GFX90A_ONLY_TO))


def nvls_offered(collective: Collective | str, reduction: tuple[str, str]) -> bool:
    """Whether NCCL offers NVLS and NVLSTree for ``collective`` of ``reduction`` (data type,
    op): where the switch reduces that type by that op, or for any all-gather (``enqueue.cc``)."""
    collective = Collective.parse(collective) if not isinstance(collective, Collective) else collective
    return collective is Collective.ALLGATHER or nvls_reduces(*reduction)


def pick(topo: Topology | NcclFabric, collective: Collective | str, nbytes: int,
         env: dict[str, str] | None = None, elem_bytes: int = 4, ranks_per_process: int = 1,
         rccl_release: Release | None = None, reduction: tuple[str, str] = ("float", "sum")) -> NcclEstimate:
    """NCCL's choice: the estimate NCCL's own model times fastest (ties keep NCCL's search order);
    on RCCL, its MSCCL all-pairs algorithm wherever that runs (``treeattn.cost.msccl``).

    Args:
        topo: the topology or its ``fabric`` summary.
        collective: allreduce, allgather, reducescatter, broadcast or reduce.
        nbytes: size as nccl-tests counts it.
        env: NCCL environment variables that restrict the choice (``allowed_by_env``).
        elem_bytes: the element's size (see ``predict``).
        ranks_per_process: the communicator's ranks one process drives (nccl-tests' threads
            x GPUs a process).
        rccl_release: the RCCL release (None: unknown, the one ``treeattn.cost.msccl`` follows);
            before 2.21 MSCCL does not run where a process drives several ranks
            (``msccl.single_process_blocks``); up to 2.21.5 LL128 runs on gfx90a GPUs only
            (``topo_rccl_without_ll128``) unless ``NCCL_PROTO`` names it.
        reduction: (data type, reduction op) of the call, as nccl-tests prints them or
            treeattn's dtypes (``("fp32", "max")``); NVLink SHARP reduces only some
            (``nvls.nvls_reduces``), and gathers any. Default nccl-tests' float sum.

    Returns:
        The fastest NcclEstimate NCCL may use.

    Raises:
        InputError: the environment leaves no algorithm and protocol for this collective.
    """
    algos, protos = allowed_by_env(env)
    fab = topo if isinstance(topo, NcclFabric) else fabric(topo)  # once, for the two reads below
    if "NCCL_PROTO" not in (env or {}) and topo_rccl_without_ll128(fab, rccl_release):
        protos.discard(Protocol.LL128.value.lower())  # NCCL_PROTO naming LL128 enables it on RCCL too
    if msccl.single_process_blocks(ranks_per_process, rccl_release, msccl_single_process(env)):
        algos.discard(Algorithm.ALLPAIRS.value)
    reduces = nvls_offered(collective, reduction)
    if not reduces:
        algos -= {Algorithm.NVLS.value, Algorithm.NVLS_TREE.value}
    best: NcclEstimate | None = None
    for est in predict(fab, collective, nbytes, elem_bytes):
        if est.algorithm is Algorithm.ALLPAIRS and est.algorithm.value in algos:
            return est  # RCCL's MSCCL runs whenever one of its files covers the call
        if est.algorithm.value not in algos or est.protocol.value.lower() not in protos:
            continue
        if best is None or est.rank_us < best.rank_us:
            best = est
    if best is None:
        why = "" if reduces else f" ({reduction[0]} {reduction[1]}: NVLink SHARP does not reduce it)"
        said = " ".join(f"{k}={v}" for k, v in sorted((env or {}).items()))
        unmodelled = any(w in said.lower() for w in ("collnet", "pat"))
        raise InputError(f"{said or 'the NCCL environment'} leaves no algorithm and protocol "
                         + (f"the model knows for {collective}{why} (it models ring, tree, NVLS, NVLSTree and RCCL's "
                            "all-pairs; not CollNet or PAT)" if unmodelled else
                            f"this topology runs for {collective}{why}"))
    return best
