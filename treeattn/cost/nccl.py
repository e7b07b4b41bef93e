"""A model of NCCL's own cost model: what NCCL would pick, and how long that takes.

Built from NCCL's published tuning constants (``src/graph/tuning.cc``, v2.19-2.30; the
figures and where they come from are in docs/nccl-model.md), with the bus bandwidths derived
from the topology. Each estimate carries two times: ``rank_us``, NCCL's own estimate, which
it picks by, and ``time_us``, what the algorithm achieves (what nccl-tests measures), which
differs where the published record shows NCCL's estimate off (below). What we took, and
what we left out:

Latency, microseconds, per protocol (LL, LL128, Simple):

    base          Tree  6.8  14    8.4      Ring  6.6  14    8.4
    hop NVLink    Tree  0.6  1.25  4        Ring  0.6  1.9   3.4
    hop PCIe      Tree  1.0  1.9   4        Ring  1.0  2.5   5.7
    hop network   Tree  5.0  8.5   14       Ring  2.7  4.0   14

* ring all-reduce: base + (2(R-1) - 2(Nn-1)) intra + 2(Nn-1) inter (R ranks, Nn nodes);
  ring all-gather / reduce-scatter: base + ((R-1) - (Nn-1)) intra + (Nn-1) inter;
  broadcast and reduce, a pipelined chain through all ranks: base + (R-Nn) intra + (Nn-1) inter;
  tree all-reduce (reduce up, broadcast down): base + 2((R/Nn - 1) intra + floor(log2 Nn) inter).
  Tree is offered for all-reduce only, as in NCCL. The intra hop is NVLink when the ranks'
  GPUs have a GPU fabric (NVLink/xGMI), else PCIe.

Bandwidth (GB/s): ``bus`` = the slowest per-rank intra-node bandwidth (when a node holds
more than one rank) and the slowest node's network bandwidth (when there is more than one
node), whichever is smaller. NCCL's per-link figures are below datasheet; we scale each
link by NCCL's figure over the datasheet one: NVLink 20.0/25 (gen 2-3, SM70-80),
20.6/25 (gen 4, SM90), 40.1/50 (gen 5, SM100); xGMI 48/64 (RCCL, gfx94x). A PCIe link
NCCL rates by its generation and width alone (``topo.cc``: width x per-lane speed / 80:
12/24/48/96 GB/s per x16 for Gen3/4/5/6), whatever rate the topology measured for it;
a PCIe link without a width is scaled like the others, from the datasheet x16 figure;
network links at their port speed (NCCL takes the NIC speed). So an 18-link H100 gives
18 x 20.6 = 370.8 GB/s. Per-rank intra = its GPU-fabric links summed (NCCL spreads its
channels over all of them), else its PCIe uplinks, else its loopback link. Per-node
inter = the egress of the NICs its ranks use, summed (NIC bandwidth x NICs per node).

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
  slowest node's sum of its channels' rates).

Ranks of a node joined by one GPU fabric (NVLink/xGMI, NVSwitch) keep NCCL's figure: NCCL
spreads channels over every fabric link (a hybrid cube-mesh's rings use all six NVLinks),
which one route per rank pair cannot show. Per-hop latency is at least the route's own
(the sum of its links' ``latency_us``): max(NCCL's constant, the slowest ring hop's
route) inside a node and across nodes (a bounce through host memory crosses four links).

What is not charged here: the topology's per-message ``cost.overhead_us``. NCCL's
constants are fitted to nccl-tests' back-to-back loop, where the host's cost of issuing a
call overlaps the previous call; the simulator (``treeattn.cost.simulate``) adds one
``overhead_us`` per collective call, as it charges one per message of a plan. Ranks on
``host`` devices (CPU-only runs, gloo) are not timed by this model at all in the
simulator (``treeattn.cost.gloo``).

Derating, as NCCL: ring LL x0.5 capped at llMaxBw; ring LL128 x0.92; tree all-reduce
x0.92; then tree LL x1/3.8 capped at llMaxBw; tree LL128 x7/9 on one node, x120/128
across nodes. Ring LL128, tree and tree LL128 are also capped at the ring/tree graph's
channels (``nccl_channels.graph_channels``: 8 on DGX H100 nodes with 8 NICs) times NCCL's
per-channel figure (``perChMaxRingLL128Bws``, ``perChMaxTreeBws``, ``perChMaxTreeLL128Bws``
by GPU generation for 1 / 2 / more nodes; on 4 or more H100 nodes the tree's 8 x 36 GB/s
and its LL128's 8 x 29 bind), in NCCL's estimate and in what runs. llMaxBw by GPU
generation and node count (1 / 2 / more): Volta 39/39/20.4, Ampere 87.7/22.5/19, Hopper
141/45/35, Blackwell 282/90/70 (non-NVIDIA devices: Hopper's).
Algorithm bandwidth = bus x R/nsteps for ring (nsteps 2(R-1) all-reduce, R-1 all-gather
and reduce-scatter, R broadcast and reduce), bus x 0.5 for tree. Tree bandwidth is further scaled
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
NCCL's maintainers quote for a 400 Gb/s NIC; LL128 0.6, measured on the corpus). On Ampere
each channel a call runs on beyond its first adds ``AMPERE_CHANNEL_US`` (fitted on published
A100 tables; NCCL's estimate does not see it). A one-node NVLink ring all-reduce, all-gather or
reduce-scatter with Simple ends ``ring_step_tail_us`` late (``RING_STEP_TAIL_US``: about half
a ring step at 100 us steps, measured on the corpus, its cause not found).
``NCCL_ALGO``, ``NCCL_PROTO`` and ``NCCL_NVLS_ENABLE=0`` restrict the pick (``allowed_by_env``).

Channels (``treeattn.cost.nccl_channels``): NCCL's figures are those of all its channels;
below a size NCCL runs a ring or tree on fewer (``run_channels``), and what runs moves that
share of the bandwidth; NCCL's estimate does not see it (RCCL, on AMD GPUs, left out: it runs
small all-reduces through its MSCCL kernels). A multi-node ring all-reduce with
Simple has NCCL's "plateau" latency, x1.4 (x1.9 on Volta) once each channel and rank holds
64 bytes, in NCCL's estimate and in what runs.

RCCL (AMD GPUs): one node of 8 GPUs with an xGMI link per pair runs an all-reduce through
RCCL's MSCCL all-pairs algorithm wherever one of its algorithm files covers the size
(``treeattn.cost.msccl``: 1 KiB to 16 MiB; ``Algorithm.ALLPAIRS``, picked ahead of the
tuner's ring and tree, not restricted by ``NCCL_ALGO``; ``RCCL_MSCCL_ENABLE=0`` turns it off).

GPUs without peer-to-peer (GeForce): NCCL's shared-memory transport carries their traffic
through host memory. NCCL's estimate rates that path at PCIe speed and picks by it; what runs
moves at most ``SHM_GBPS`` of bus bandwidth, or the host's measured ``cost.shm_gbps``
(``NcclFabric.shm_gbps``, ``shm_rate_gbps``), and each point-to-point
transfer between such GPUs at most that (``shm_pair_gbps``, which the simulator reads).

NCCL releases: NVLS's latencies and NCCL's NVLS/NVLSTree estimate (``treeattn.cost.nvls``),
and NCCL's estimate of ring LL and LL128 (before 2.21.5 LL at a quarter of the graph's
bandwidth, not half, Hopper's llMaxBw Ampere's; before 2.23.4 LL128 at 0.7 with one rank per
node), follow ``NcclFabric.nccl_release``: the topology's ``cost.nccl_version``, else the
newest release the model follows (``check-model`` sets each published table's). The
estimate only ranks the choices; what runs, and every other figure, is NCCL 2.30's.

Left out: CollNet (in-network reduction over InfiniBand SHARP), PAT, NVLS for all-gather and
reduce-scatter, the older releases' ring and tree figures (2.19-2.22 rated Tree/Simple at 28
us a hop and charged a ring's own network latency with one rank per node), and the latency of an EFA or
RoCE network beyond NCCL's constants.

Sizes follow nccl-tests: ``nbytes`` is the buffer size for all-reduce, broadcast and reduce and the
total (all ranks') size for all-gather and reduce-scatter. busbw = algbw x 2(R-1)/R for
all-reduce, x (R-1)/R for all-gather and reduce-scatter, x 1 for broadcast and reduce.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from treeattn.cost import msccl
from treeattn.cost.nccl_channels import comm_channels, graph_channels, run_channels
from treeattn.cost.nvls import nvls_allreduce, nvls_channels
from treeattn.errors import InputError
from treeattn.topology.model import DeviceKind, Link, LinkClass, LinkKind, Topology
from treeattn.topology.nccl_version import NEWEST, OLDEST, Release, by_release, nccl_release

__all__ = [
    "ENV_SETTINGS",
    "Collective",
    "Algorithm",
    "Protocol",
    "NcclFabric",
    "NcclEstimate",
    "fabric",
    "predict",
    "pick",
    "allowed_by_env",
    "busbw_factor",
    "nccl_arch",
    "chain_call_latency_us",
    "run_channel_count",
    "nccl_link_bw_gbps",
    "nic_bw",
    "fabric_bw",
    "p2p_link_gbps",
    "transfer_gbps",
    "shm_pair",
    "shm_pair_gbps",
    "shm_rate_gbps",
    "shm_pairs",
    "pair_rate_gbps",
    "SHM_GBPS",
    "AMPERE_CHANNEL_US",
    "RING_STEP_TAIL_US",
    "RING_STEP_TAIL_POWER",
    "ring_step_tail_us",
    "shm_rate_applies",
]


class Collective(StrEnum):
    """Collectives the model times (nccl-tests names without ``_perf``)."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"

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
    NVLS = "nvls"
    NVLS_TREE = "nvlstree"
    ALLPAIRS = "allpairs"  # RCCL's MSCCL all-reduce (treeattn.cost.msccl), not an NCCL_ALGO name


_NCCL_ALGOS = (Algorithm.TREE, Algorithm.RING, Algorithm.NVLS, Algorithm.NVLS_TREE)


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
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
# llMaxBw (GB/s) by GPU generation, for 1 / 2 / more nodes.
_LL_MAX = {
    "volta": (39.0, 39.0, 20.4),
    "ampere": (87.7, 22.5, 19.0),
    "hopper": (141.0, 45.0, 35.0),
    "blackwell": (282.0, 90.0, 70.0),
}
# NCCL's estimate of ring LL and LL128 before 2.21.5 / 2.23.4 (tuning.cc, unchanged from 2.8
# through 2.20): LL at a quarter of the graph's bandwidth (a third on one node for all-gather,
# reduce-scatter and broadcast), not half, with Hopper's llMaxBw Ampere's; LL128 at 0.7 of it
# with one rank per node. Only the estimate, which ranks the choices: 2.21.5 and 2.23.4 changed
# tuning.cc, not the LL or LL128 kernels, so what runs keeps the newest figures.
_RING_LL_SHARE: tuple[tuple[Release, tuple[float, float]], ...] = (
    (OLDEST, (0.25, 1.0 / 3.0)), ((2, 21, 5), (0.5, 0.5)))
"""(first release, (share of the graph's bandwidth: all-reduce, reduce or several nodes; other))."""
_HOPPER_LL_MAX: tuple[tuple[Release, tuple[float, float, float]], ...] = (
    (OLDEST, _LL_MAX["ampere"]), ((2, 21, 5), _LL_MAX["hopper"]))
_RING_LL128_ONE_PER_NODE: tuple[tuple[Release, float], ...] = ((OLDEST, 0.7), ((2, 23, 4), 0.92))
# Per-channel caps (GB/s) of NCCL's bus bandwidth, by GPU generation for 1 / 2 / more nodes
# (tuning.cc perChMaxRingLL128Bws, perChMaxTreeBws, perChMaxTreeLL128Bws, NCCL 2.30; the
# same for Volta-Hopper since 2.19): times the ring/tree graph's channels.
_PER_CH_RING_LL128 = {"volta": (20.0,) * 3, "ampere": (20.0,) * 3, "hopper": (36.7,) * 3, "blackwell": (40.0,) * 3}
_PER_CH_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
                "blackwell": (70.0, 42.8, 24.0)}
_PER_CH_TREE_LL128 = {"volta": (20.0,) * 3, "ampere": (20.0,) * 3, "hopper": (36.7, 36.7, 29.0),
                      "blackwell": (55.6, 31.67, 20.0)}
# What each protocol achieves across nodes, as a share of NCCL's network figure (its NIC's port
# speed): Simple 0.94, NCCL's maintainers' "46-48 GB/s from each CX7 NIC at 400Gbps"
# (nccl-tests issues 290 and 319); LL128 0.6, measured on the corpus's multi-node rows
# (results/published, docs/nccl-model.md); LL is capped by llMaxBw long before the network.
NET_ACHIEVED = {Protocol.LL: 1.0, Protocol.LL128: 0.6, Protocol.SIMPLE: 0.94}
AMPERE_CHANNEL_US = 1.52
"""What each channel a call runs on beyond its first adds to the call on Ampere GPUs (us),
whatever the protocol and size: a per-call figure fitted on one source and one NCCL release,
its cause not found in NCCL's source. ABCI's one-node A100 tables (abci-a100-1node: NCCL
2.8.4, one process per GPU, 8 and 4 GPUs, all-reduce and broadcast) grow with the channels
NCCL's thresholds give while each channel's bytes stay fixed (8 A100s, all-reduce: 34.8 / 39.3 /
41.6 / 48.2 / 58.3 us on 1 / 2 / 4 / 8 / 16 channels of 32 KiB each), 1.36-1.81 us a channel
by table; fitted on their ring LL rows of 16 KiB-1 MiB (least squares, each table its own
intercept). There the channels follow the bytes; what tells them apart is the broadcast on 24
channels (53.3 us at 1 MiB, 55.7 at 2 MiB). Carried, unfitted, to LL128 and Simple, to several
nodes and to Ada. Held out, at 64 KiB-16 MiB (median |error|): SuperBench's A100 VM 40.6 ->
15.8 %, the unnamed A100 node 29.8 -> 9.7 %, DeepOps' 2- and 4-node A100 rings 21.7 -> 14.4 %
(docs/nccl-model.md). Hopper shows no such cost on NCCL 2.26 (8 x H100, ring all-reduce at
2 MiB on 24 channels: 43.2 us, the model 41.0 without it; one row, on its -g 8 launch floor,
which rules out tens of microseconds, not one); every Ampere table of the corpus ran NCCL 2.19
or older and every Hopper one 2.24 or newer, so the GPU and the release cannot be told apart.
Ada GPUs take NCCL's Ampere row, and this with it."""
RING_STEP_TAIL_US = 52.0
RING_STEP_TAIL_POWER = 0.75
"""What a ring all-reduce, all-gather or reduce-scatter with Simple adds on one node of NVIDIA
GPUs joined by NVLink: ``RING_STEP_TAIL_US`` x (step / 100 us) ** ``RING_STEP_TAIL_POWER``
microseconds, where a step is the call's time (NCCL's formulas) over its ring steps (2(R-1) for
all-reduce, R-1 for the others): about one step at 10 us steps, half of one at 100 us, a sixth
at 10 ms. Measured, its cause not found in NCCL's source (whose ring forwards each slice as it
lands, with no bubble; a cost per call would fade as 1 / size and one per loop or slice keep
a fixed share once loops are full, where this fades as size ** -0.25). Seen on the one-node
H100 tables (3 sources, 118 rows) and SuperBench's 8 A100s (29): the time a doubling of the
size adds runs 1-30 % above the large-size rate from 32 MiB to 1 GiB and falls slowly
(xxrjun's 4 H100s' reduce-scatter: 1.30 at 64 MiB, 1.16 at 512 MiB, 1.06 at 4 GiB, 1.03 at
16 GiB), more for all-gather and reduce-scatter than all-reduce and for 4 GPUs than 8, as a
fixed share of a step would; not on PCIe (RTX 4090) or MI300X's xGMI (a constant 6 %, a
rate); left off across nodes, where the corpus's rings disagree with each other
(docs/nccl-model.md). Fitted on the corpus's 156 one-node NVLink rows of 7 sources whose pick
is ring/Simple (relative least squares, the power on a 0.05 grid: 52.07 us, 0.75; a time per
call, a share of the call or a share of a step leave 1.9-2.9 times its squared error). An H100 figure:
H100's rows alone give 48 us, A100's 90 (SuperBench's alone 94), so A100 rings stay fast
(SuperBench's all-gather at 32 MiB -18.8 %); ABCI, the unnamed A100 node and OCI's GB200 tray
have 2-4 rows each. Each source left out, the others' fit gives 49-56 us and 0.75 and
predicts it better (median |error| waynehacking8 9.4 -> 1.8 %, xxrjun 5.9 -> 1.5, SuperBench
5.9 -> 2.1, Together 2.2 -> 1.1, ABCI 11.0 -> 6.4, unnamed A100 16.7 -> 13.4, OCI GB200 8.3 ->
4.6). Not in NCCL's estimate, which picks; not on broadcast and reduce, whose chains
SuperBench's A100s show it on and ABCI's 4 A100s do not (they would come out +8..+27 % slow).
Applied to any one-node NVLink fabric, NVSwitch or not: a DGX-1's cube mesh or a 72-GPU NVL72
domain is outside the data."""
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
# getNetOverhead: network post overhead per ring step, by CPU vendor (x3 for Simple).
_NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "other": 1.0}
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
    """Slowest per-rank intra-node bandwidth of the ring: NCCL's figures, capped by the routes'
    shared links (inf when every node holds one rank)."""
    inter_bw_gbps: float
    """Slowest node's network bandwidth, capped by the routes' shared links (inf on one node)."""
    intra_hw: str
    """``nvlink`` or ``pci``: which hop latencies apply inside a node."""
    arch: str
    """GPU generation for llMaxBw: volta, ampere, hopper, blackwell."""
    ll128: bool
    """Whether NCCL would enable LL128 (GPU fabric present)."""
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
    nccl_release: Release = NEWEST
    """The NCCL release whose release-dependent figures apply (``treeattn.topology.nccl_version``;
    NVLS only); default: the newest the model follows."""
    rccl: bool = False
    """Whether the GPUs are AMD's (xGMI): RCCL, which the model times with NCCL's figures
    except where its MSCCL all-pairs algorithm runs."""
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
        """The bus bandwidth of the tree algorithm (its intra-node chain may share links differently)."""
        intra = self.tree_intra_bw_gbps if math.isfinite(self.tree_intra_bw_gbps) else self.intra_bw_gbps
        bw = min(intra, self.inter_bw_gbps)
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
    nccl_us: float | None = None
    """NCCL's own estimate, which it picks by, where it differs from ``time_us`` (what the
    algorithm achieves); None: the same."""

    @property
    def rank_us(self) -> float:
        """What NCCL compares when it picks."""
        return self.time_us if self.nccl_us is None else self.nccl_us

    def to_dict(self) -> dict:
        return {
            "algorithm": self.algorithm.value,
            "protocol": self.protocol.value,
            "time_us": self.time_us,
            "nccl_us": self.rank_us,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps,
            "latency_us": self.latency_us,
        }


def busbw_factor(collective: Collective, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: 2(n-1)/n all-reduce, (n-1)/n gather/scatter, 1 broadcast and reduce."""
    collective = Collective(collective)
    if collective is Collective.ALLREDUCE:
        return 2.0 * (ranks - 1) / ranks
    if collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return (ranks - 1) / ranks
    return 1.0


_AMPERE_ROW = ("A100", "A800", "A30", "A10", "RTX-40", "RTX 40", "RTX-30", "RTX 30", "L40", "L4-", "A6000")


def nccl_arch(model: str) -> str:
    """The architecture whose row of NCCL's tables a GPU ``model`` takes (``hopper`` for a name
    none of the rules places)."""
    m = model.upper()
    if "B200" in m or "B100" in m or "GB200" in m or "B300" in m:
        return "blackwell"
    # NCCL indexes its tables by compute capability: 8.x (Ampere, and Ada's 8.9: RTX 40xx,
    # L40, L4) takes the Ampere row.
    if any(k in m for k in _AMPERE_ROW):
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
        if link.generation in _PCIE_X16 and link.width:
            # NCCL rates a PCIe link by its generation and width alone (topo.cc: width x speed / 80).
            return _PCIE_X16[link.generation] * link.width / 16
        if link.generation in _PCIE_X16:
            return link.bw_gbps * _PCIE_X16[link.generation] / _PCIE_DATASHEET_X16[link.generation]
        return link.bw_gbps * _PCIE_X16[4] / _PCIE_DATASHEET_X16[4]
    return link.bw_gbps


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


def shm_rate_applies(topo: Topology) -> bool:
    """Whether ``topo``'s ranks are GPUs some of which lack peer-to-peer: pairs NCCL's
    shared-memory transport carries (``shm_pair``), whatever the links' rates."""
    devs = [topo.rank_device(r) for r in range(topo.num_ranks)]
    return all(d.kind is DeviceKind.GPU for d in devs) and any(not d.p2p for d in devs)


def shm_pair(topo: Topology, a: int, b: int) -> bool:
    """Whether rank ``a``'s transfers to rank ``b`` go through NCCL's shared-memory transport:
    GPUs of one node, one without peer-to-peer, not joined by a GPU fabric (routing bounces
    their copies through the CPU)."""
    da, db = topo.rank_device(a), topo.rank_device(b)
    if (a == b or da.kind is not DeviceKind.GPU or db.kind is not DeviceKind.GPU or da.node != db.node
            or da.node < 0 or (da.p2p and db.p2p)):
        return False
    links = topo.links
    return not all(links[i].cls is LinkClass.GPU_FABRIC for i in topo.route(a, b))


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
    n = topo.num_ranks
    return sum(shm_pair_gbps(topo, a, b) < math.inf for a in range(n) for b in range(n) if a != b)


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
    any_fabric = all(
        d.kind is DeviceKind.GPU and any(ln.cls is LinkClass.GPU_FABRIC for ln in out.get(d.name, ())) for d in devs
    )
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
    searched = (own or nodes > 1) and not rccl
    channels, ring_gbps = (comm_channels(arch, nodes, path_gbps or gpu_gbps, gpu_gbps, n_nics, nic_gbps)
                           if searched else (0, 0.0))
    graph = graph_channels(arch, nodes, path_gbps or gpu_gbps, gpu_gbps, n_nics, nic_gbps)[0] if searched else 0
    return NcclFabric(
        nccl_release=nccl_release(topo.cost.nccl_version) if topo.cost.nccl_version is not None else NEWEST,
        shm_gbps=shm_rate_gbps(topo) if any(shm_pair_gbps(topo, a, b) < math.inf for a, b in intra_pairs) else 0.0,
        rccl=rccl,
        allpairs_gbps=_allpairs_gbps(topo, arch) if rccl and nodes == 1 else 0.0,
        channels=channels,
        graph_channels=graph,
        ring_gbps=ring_gbps,
        cpu=_cpu_vendor(topo),
        nvls_gbps=_nvls_gbps(topo, devs, per_node, out, arch),
        ranks=topo.num_ranks,
        nodes=nodes,
        intra_bw_gbps=intra,
        inter_bw_gbps=inter,
        intra_hw="nvlink" if any_fabric else "pci",
        arch=arch,
        ll128=any_fabric,
        tree_intra_bw_gbps=tree_intra,
        intra_route_us=intra_route,
        inter_route_us=inter_route,
        limit="; ".join(limits),
    )


def shm_rate_gbps(topo: Topology) -> float:
    """What NCCL's shared-memory transport moves between two GPUs without peer-to-peer on
    ``topo``'s host: its ``cost.shm_gbps`` (measured or written), else ``SHM_GBPS``."""
    return topo.cost.shm_gbps or SHM_GBPS


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
    idx = topo._index
    isl = [idx.island(d.name) for d in devs]
    machines: dict[int, set[int]] = {}
    for i, d in zip(isl, devs, strict=True):
        if i >= 0:
            machines.setdefault(i, set()).add(d.node)
    out: dict[tuple[int, int], list[int]] = {}
    for r, (i, d) in enumerate(zip(isl, devs, strict=True)):
        key = (1, i) if i >= 0 and len(machines[i]) > 1 else (0, d.node)
        out.setdefault(key, []).append(r)
    return out


def _cpu_vendor(topo: Topology) -> str:
    models = " ".join(d.model.upper() for d in topo.devices if d.kind is DeviceKind.CPU)
    if "EPYC" in models or "AMD" in models:
        return "amd"
    if "XEON" in models or "INTEL" in models or not models:
        return "intel"
    return "other"


def _nvls_gbps(topo: Topology, devs: list, per_node: dict, out: dict[str, list[Link]], arch: str) -> float:
    """A GPU's NVLink figure when every node's ranks (two or more) share an NVSwitch fabric."""
    if arch not in ("hopper", "blackwell"):
        return 0.0
    idx = topo._index
    switched = {idx.island(d.name) for d in topo.devices if d.kind is DeviceKind.NVSWITCH} - {-1}
    for ranks in per_node.values():
        if len(ranks) < 2 or len({idx.island(devs[r].name) for r in ranks} - switched) or \
                len({idx.island(devs[r].name) for r in ranks}) != 1:
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


def nic_bw(links: Iterable[Link]) -> float:
    """A NIC's network bandwidth: its network links out."""
    return sum(ln.bw_gbps for ln in links if ln.cls is LinkClass.NETWORK)


def fabric_bw(links: Iterable[Link], arch: str) -> float:
    """A GPU's NVLink/xGMI bandwidth as NCCL rates it: its fabric links out."""
    return sum(nccl_link_bw_gbps(ln, arch) for ln in links if ln.cls is LinkClass.GPU_FABRIC)


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
        idx = self.topo._index
        isl = {idx.island(self.topo.ranks[r]) for r in ranks}
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


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


def _nsteps(collective: Collective, ranks: int) -> int:
    if collective is Collective.ALLREDUCE:
        return 2 * (ranks - 1)
    if collective in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return ranks - 1
    return ranks


def _hop_us(fab: NcclFabric, algo: Algorithm, p: int) -> tuple[float, float]:
    """One hop's latency inside a node and across nodes, for an algorithm x protocol."""
    # A hop is never faster than its route's own latency (a bounce through host memory, a long network path).
    intra = max(_HOP[fab.intra_hw][algo][p], fab.intra_route_us)
    # One rank per node exposes the network latency whole: NCCL charges the tree's figure.
    net = _HOP["net"][Algorithm.TREE if fab.ranks == fab.nodes else algo][p]
    return intra, max(net, fab.inter_route_us)


def _latency_us(fab: NcclFabric, collective: Collective, algo: Algorithm, p: int, tuner: bool = True) -> float:
    """Latency of one algorithm x protocol: NCCL's tuner's (``tuner``), or what runs, which
    leaves out the per-step network post overhead NCCL adds to multi-node rings."""
    r, nn = fab.ranks, fab.nodes
    intra, inter = _hop_us(fab, algo, p)
    base = _BASE[algo][p]
    if algo is Algorithm.TREE:
        return base + 2 * ((r // nn - 1) * intra + _log2i(nn) * inter)
    if tuner and nn > 1 and collective not in (Collective.BROADCAST, Collective.REDUCE):
        # A multi-node ring still posts every step to the network proxy (getNetOverhead).
        intra = max(intra, _NET_OVERHEAD_US[fab.cpu] * (3 if _PROTOS[p] is Protocol.SIMPLE else 1))
    if collective is Collective.ALLREDUCE:
        return base + (2 * (r - 1) - 2 * (nn - 1)) * intra + 2 * (nn - 1) * inter
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
    """The fabric as a protocol drives it across nodes: the network at ``NET_ACHIEVED`` of
    NCCL's figure (see the module docstring)."""
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
            if proto is Protocol.LL128 and not fab.ll128:
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


def _env_list(value: str, names: tuple[str, ...], what: str) -> set[str]:
    """NCCL's list syntax (``Ring,Tree``, ``^LL128``), function prefixes left out: the
    names it enables, lower-case."""
    text = value.strip()
    if ";" in text or ":" in text:
        raise InputError(f"{what}={value!r}: per-function lists are not modelled; give one list for all")
    negate = text.startswith("^")
    items = {x.strip().lower() for x in text.lstrip("^").split(",") if x.strip()}
    known = {n.lower() for n in names}
    bad = sorted(items - known - {"collnetdirect", "collnetchain", "pat"})
    if bad:
        raise InputError(f"{what}={value!r}: unknown {bad[0]!r}; NCCL knows {', '.join(names)}")
    return known - items if negate else items & known


def _int_env(value: str | None, default: int) -> int:
    """An integer variable as NCCL's and RCCL's parameters read it (``strtoll(value, NULL, 0)``:
    the leading number, hex after ``0x``, octal after ``0``; else 0)."""
    if value is None:
        return default
    m = re.match(r"\s*([+-]?)(?:0[xX]([0-9a-fA-F]+)|(0[0-7]*)|([1-9]\d*))", str(value))
    if not m:
        return 0
    sign, hexa, octal, decimal = m.groups()
    n = int(hexa, 16) if hexa else int(octal, 8) if octal else int(decimal)
    return -n if sign == "-" else n


ENV_SETTINGS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "RCCL_MSCCL_ENABLE")
"""The environment variables ``allowed_by_env`` reads: the only ones that change the model's pick."""


def allowed_by_env(env: dict[str, str] | None) -> tuple[set[str], set[str]]:
    """The algorithms and protocols an NCCL environment leaves enabled (lower-case names).

    Reads ``NCCL_ALGO`` and ``NCCL_PROTO`` (NCCL's list syntax), ``NCCL_NVLS_ENABLE`` and
    ``RCCL_MSCCL_ENABLE`` (integers, as NCCL and RCCL read them: 0 turns NVLS or MSCCL off);
    other variables do not change what this model picks.
    """
    env = env or {}
    algos = {a.value for a in _NCCL_ALGOS}
    protos = {p.value.lower() for p in Protocol}
    if "NCCL_ALGO" in env:
        algos = _env_list(env["NCCL_ALGO"], tuple(a.value for a in _NCCL_ALGOS), "NCCL_ALGO")
    if "NCCL_PROTO" in env:
        protos = _env_list(env["NCCL_PROTO"], tuple(p.value for p in Protocol), "NCCL_PROTO")
    if _int_env(env.get("NCCL_NVLS_ENABLE"), 2) == 0:  # NCCL: 0, "00", "false" alike turn NVLS off
        algos -= {"nvls", "nvlstree"}
    # RCCL's MSCCL runs ahead of its tuner, whatever NCCL_ALGO and NCCL_PROTO say; its own
    # switch turns it off (msccl_lifecycle.cc: RCCL_MSCCL_ENABLE).
    if _int_env(env.get("RCCL_MSCCL_ENABLE"), 1) != 0:
        algos.add(Algorithm.ALLPAIRS.value)
    return algos, protos


def pick(topo: Topology | NcclFabric, collective: Collective | str, nbytes: int,
         env: dict[str, str] | None = None, elem_bytes: int = 4) -> NcclEstimate:
    """NCCL's choice: the estimate NCCL's own model times fastest (ties keep NCCL's search order);
    on RCCL, its MSCCL all-pairs algorithm wherever that runs (``treeattn.cost.msccl``).

    Args:
        topo: the topology or its ``fabric`` summary.
        collective: allreduce, allgather, reducescatter, broadcast or reduce.
        nbytes: size as nccl-tests counts it.
        env: NCCL environment variables that restrict the choice (``allowed_by_env``).
        elem_bytes: the element's size (see ``predict``).

    Returns:
        The fastest NcclEstimate NCCL may use.

    Raises:
        InputError: the environment leaves no algorithm and protocol for this collective.
    """
    algos, protos = allowed_by_env(env)
    best: NcclEstimate | None = None
    for est in predict(topo, collective, nbytes, elem_bytes):
        if est.algorithm is Algorithm.ALLPAIRS and est.algorithm.value in algos:
            return est  # RCCL's MSCCL runs whenever one of its files covers the call
        if est.algorithm.value not in algos or est.protocol.value.lower() not in protos:
            continue
        if best is None or est.rank_us < best.rank_us:
            best = est
    if best is None:
        raise InputError(f"the NCCL environment {env} leaves no algorithm and protocol for {collective}")
    return best
