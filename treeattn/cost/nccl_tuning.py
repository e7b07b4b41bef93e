"""NCCL's tuning constants, and the names the NCCL model (``treeattn.cost.nccl``) works in.

The collectives, algorithms and protocols; the figures of NCCL's own tuner, from its
``src/graph/tuning.cc`` (v2.19-2.30; the figures and where they come from are in
docs/nccl-model.md); the figures measured where the published record shows NCCL's estimate
off (``NET_ACHIEVED``, ``AMPERE_CHANNEL_US``, ``RING_STEP_TAIL_US``); which row of NCCL's
tables a GPU takes (``nccl_arch``); and one algorithm x protocol as the model times it
(``NcclEstimate``, ``busbw_factor``). How ``treeattn.cost.nccl`` combines them is in its
module docstring.

Latency, microseconds, per protocol (LL, LL128, Simple):

    base          Tree  6.8  14    8.4      Ring  6.6  14    8.4
    hop NVLink    Tree  0.6  1.25  4        Ring  0.6  1.9   3.4
    hop PCIe      Tree  1.0  1.9   4        Ring  1.0  2.5   5.7
    hop network   Tree  5.0  8.5   14       Ring  2.7  4.0   14

llMaxBw by GPU generation and node count (1 / 2 / more): Volta 39/39/20.4, Ampere 87.7/22.5/19, Hopper
141/45/35, Blackwell 282/90/70 (non-NVIDIA devices: Hopper's). Per-channel caps by GPU generation
for 1 / 2 / more nodes: ``perChMaxRingLL128Bws``, ``perChMaxTreeBws``, ``perChMaxTreeLL128Bws``.

Sizes follow nccl-tests: ``nbytes`` is the buffer size for all-reduce, broadcast and reduce and the
total (all ranks') size for all-gather and reduce-scatter. busbw = algbw x 2(R-1)/R for
all-reduce, x (R-1)/R for all-gather and reduce-scatter, x 1 for broadcast and reduce.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from treeattn.errors import InputError
from treeattn.topology.nccl_version import OLDEST, Release

__all__ = [
    "Collective",
    "Algorithm",
    "Protocol",
    "NcclEstimate",
    "busbw_factor",
    "nccl_arch",
    "AMPERE_CHANNEL_US",
    "OLD_LATENCY_BEFORE",
    "RING_STEP_TAIL_US",
    "RING_STEP_TAIL_POWER",
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
# NCCL's estimate before 2.23.4 (tuning.cc v2.19.3-v2.22.3): a tree with Simple had no base
# latency and 28 us a hop on NVLink, PCIe and the network alike; a multi-node ring all-reduce
# counted 2 x nodes network steps, not 2 x (nodes - 1); with one rank a node a ring's network hop
# was its own figure, not the tree's. Published: NVIDIA/nccl issue 1519's tuning table (2 x 8
# H100, NCCL 2.20): Tree/Simple 448.0 us = 2 x (7 x 28 + 28), Ring/LL all-reduce 43.4 us =
# 6.6 + 26 x 1.0 + 4 x 2.7. Only the estimate, which picks: what runs keeps the newest figures.
OLD_LATENCY_BEFORE: Release = (2, 23, 4)
"""The first release with the newer latencies above."""
_OLD_TREE_SIMPLE_BASE = 0.0
_OLD_TREE_SIMPLE_HOP = 28.0
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
RCCL_XGMI_ACHIEVED = 0.94
"""What RCCL's ring moves on one node of 8 AMD GPUs joined by xGMI, as a share of RCCL's rating
of the links (``GFX94X_XGMI_WIDTH`` 48 GB/s a link, ``src/graph/topo.h``): every RCCL source of
the corpus runs its 8-GPU rings at 0.94 of it from 64 MiB to 16 GiB (ring bus bandwidth 313-319
GB/s for 7 x 48; 32 MiB rows 5-10 % below the rating's time), with Simple and with LL128 (which
takes 0.92 of that again): median 0.941 over their 44 ring rows of 32 MiB and more (4 sources;
0.930-0.946 by source; the scored 34 alone give the same median), each source's rows predicted
by the other sources' median within 1.2 % (median time error; ``tests/unit/test_published_tables.py``
recomputes both).
RCCL's ring set for these nodes (``rome_model_79``'s 14 rings) loads every directed link
equally (2 rings each), so the share is the links', not an uneven ring. MI300X and MI325X
(gfx942), 8 GPUs; not fewer GPUs of such a node (no table), not RCCL's tree, not the
simulator's own xGMI transfers (a plan's messages), not across nodes, where the corpus's
MI325X rings run faster than one node's (344-351 GB/s on 2-8 nodes) and the intra-node figure
does not bind."""
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
The second held-out check's A100 host (8 processes, pip's NCCL, likely 2.20 or later, its release
not printed): the model's error at 128 KiB-2 MiB is -5..+17 % without it, +22..+100 % with it:
evidence for the release, not proof (results/published/README.md). Ada GPUs take NCCL's Ampere
row, and this with it."""
RING_STEP_TAIL_US = 39.0
RING_STEP_TAIL_POWER = 0.70
"""What a ring all-reduce, all-gather or reduce-scatter with Simple adds on one node of NVIDIA
GPUs joined by NVLink: ``RING_STEP_TAIL_US`` x (step / 100 us) ** ``RING_STEP_TAIL_POWER``
microseconds, where a step is the call's time (NCCL's formulas) over its ring steps (2(R-1) for
all-reduce, R-1 for the others): about 0.8 of a step at 10 us steps, 0.4 at 100 us, a tenth at
10 ms. Measured, its cause not found in NCCL's source (whose ring forwards each slice as it
lands, with no bubble; a cost per call would fade as 1 / size and one per loop or slice keep
a fixed share once loops are full, where this, a share of the call, fades as the step ** -0.3). Seen on the one-node
H100 tables (3 sources, 118 rows) and SuperBench's 8 A100s (29): the time a doubling of the
size adds runs 1-30 % above the large-size rate from 32 MiB to 1 GiB and falls slowly
(xxrjun's 4 H100s' reduce-scatter: 1.30 at 64 MiB, 1.16 at 512 MiB, 1.06 at 4 GiB, 1.03 at
16 GiB), more for all-gather and reduce-scatter than all-reduce and for 4 GPUs than 8, as a
fixed share of a step would; not on PCIe (RTX 4090) or MI300X's xGMI (a constant 6 %, a
rate: ``RCCL_XGMI_ACHIEVED``); left off across nodes, where the corpus's rings disagree with each other
(docs/nccl-model.md). Fitted on the corpus's 194 one-node NVLink rows of 9 sources whose pick
is ring/Simple, before the second held-out check, whose sources are not in the fit
(relative least squares, the power on a 0.05 grid: 38.52 us, 0.70; a time per
call, a share of the call or a share of a step leave 2.0-2.2 times its squared error; 49.19 us
on the 168 rows before the held-out check's two rings of two H100s, MGHPCC's and Lambda's,
one source). An H100 figure: the four H100 sources' rows alone give 38 us (the three before
that check's, 48), A100's 81, so A100 rings stay fast (SuperBench's all-gather at 32 MiB -20.3
%); ABCI, the unnamed A100 node and OCI's GB200 tray have 2-4 rows each. Each source left out,
the others' fit gives 36-49 us and 0.70-0.75 and predicts it better (median |error|
waynehacking8 9.4 -> 2.9 %, xxrjun 5.9 -> 1.7, SuperBench 5.9 -> 3.1, Together 2.2 -> 0.7,
ABCI 11.0 -> 6.3, unnamed A100 16.7 -> 14.2, OCI GB200 8.3 -> 5.9, the two 2-GPU rings 10.9 ->
8.0) but one: LLM-Insights (12 rows of 1-8 GiB) 3.2 -> 3.3 %. The 2-GPU rings run -28..-1 %
(MGHPCC, NCCL 2.18.3) and -24..-2 % (Lambda) from 2 MiB to 8 GiB without the tail: their
excess falls with the step faster than the power law has it. LLM-Insights' 4 H100s
are within 0.1 % without the tail and 2-4 % slow with it; its A40 NVLink pair runs steps of
12-95 ms, past the others' 12 ms, where the model is 5.5 % slow without the tail (the pair
moves 47.4 GB/s over links NCCL rates at 45) and 8-10 % with it; its 4 A100s come out within
2.4 % with it (-2..-5 % without). Not in NCCL's estimate, which picks; not on broadcast and reduce, whose chains
SuperBench's A100s show it on and ABCI's 4 A100s do not (they would come out +8..+27 % slow).
Applied to any one-node NVLink fabric, NVSwitch or not: a DGX-1's cube mesh or a 72-GPU NVL72
domain is outside the data."""
# getNetOverhead: network post overhead per ring step, by CPU vendor (x3 for Simple).
_NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "other": 1.0}


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


# NCCL indexes its tables by the GPUs' compute capability (tuning.cc ``compCapIndex``: 10.0 and
# up Blackwell's row, 9.x Hopper's, 8.x Ampere's, below that Volta's): Ada (8.9: RTX 40xx, the
# L4/L20/L40 and the RTX Ada cards) takes Ampere's, GeForce and RTX PRO Blackwell (12.0)
# Blackwell's, Turing, Pascal, Maxwell and Kepler (7.5 down to 3.7: GTX, TITAN X/Xp, Quadro
# RTX/P/M, Tesla P/K) Volta's. Read anywhere in the name (as nvidia-smi
# prints it or hyphenated: "RTX-4090", "L4-24GB"), so a misspelt one ("A10O") takes the
# architecture its letters suggest.
_ROW_PATTERNS = tuple((row, re.compile("|".join(pats))) for row, pats in (
    ("ampere", (r"\bADA\b",)),  # "RTX 5000 Ada Generation" is no GeForce RTX 5090
    ("volta", (r"QUADRO RTX", r"\bT(400|500|550|600|1000|1200|2000|10)\b")),  # Turing's Quadro RTX 4000 no RTX 4090
    ("blackwell", (r"G?B(100|200|300)", r"GB10", r"RTX[ -]?50[5-9]0( TI)?", r"RTX PRO [0-9]+", r"BLACKWELL")),
    ("hopper", (r"G?H(100|200|800|20)",)),
    ("ampere", (r"A(100|800|30|40|16|2)", r"A10G?", r"RTX[ -]?[34]0[0-9]0( TI)?", r"RTX A[0-9]+", r"A[0-9]000",
                r"L(4|20|40S?)", r"ORIN", r"CMP (70|90|170)HX")),
    ("volta", (r"V100", r"T4", r"RTX[ -]?20[0-9]0( TI)?", r"TITAN (V|RTX|X|BLACK)", r"P(4|40|100)", r"GTX",
               r"QUADRO (GP100|[KMP][0-9])", r"TESLA [KMP]", r"GRID (K|M[0-9]|RTX)", r"\bMX[0-9]{3}\b",
               r"\bGT [0-9]{3,4}\b", r"\b9[0-9]0MX\b", r"XAVIER")),
))


def nccl_arch(model: str) -> str:
    """The architecture whose row of NCCL's tables a GPU ``model`` takes (``hopper`` for a name
    none of the rules places)."""
    m = model.upper().replace("_", " ")
    return next((row for row, pattern in _ROW_PATTERNS if pattern.search(m)), "hopper")
