"""NVLink SHARP all-reduce (NCCL's NVLS and NVLSTree algorithms), as NCCL rates it and as it runs.

On Hopper and Blackwell GPUs behind NVSwitches NCCL (2.17+) reduces inside the switch:
every GPU loads the sum of its share from the switch (multimem.ld_reduce) and stores it
back to every GPU at once (multimem.st). One NVLink domain runs NVLS; several domains run
NVLSTree: NVLS inside each domain, a tree across them over the network. NCCL offers both
for all-reduce with the Simple protocol only (``src/graph/tuning.cc``, v2.30), and NVLS
for all-gather and reduce-scatter on one domain (not modelled here: no published table).

NCCL's own estimate (what it picks by), from ``tuning.cc`` of NCCL 2.30, the default release
(older releases: ``_estimate_gbps`` and docs/nccl-model.md, "By NCCL release"):

* channels: the NVLS graph's (``nvls_graph``, ``src/graph/search.cc``): one per GPU of a
  domain (its heads, at most 32), at the fastest speed of NCCL's speed list that every head's
  traffic fits (the GPU's NVLink figure x heads / (heads - 1)): 8 x 50 GB/s on 8 H100s, 4 x
  60 on 4, 8 x 48 (the network list) across nodes;
* per channel: speed x nvlsEfficiency (Hopper 0.85, Blackwell 0.74) x (channels - 1) /
  channels, x 2 for all-reduce ("AllReduce pipelines two operations"); NVLSTree: also at
  most the network speed (x 2 on two domains) and at most perChMaxNVLSTreeBw (Hopper 57.7 /
  45.5, Blackwell 96 / 80 GB/s on 2 / more domains); algorithm bandwidth = channels x that x
  R / (2(R - 1)). On 4 of 8 H100s this (204 GB/s) stays under NCCL's ring (240): NCCL runs
  the ring there;
* latency: NVLS 25 us (NVLink NVLS Simple hop, base 0); NVLSTree 25 + 2 log2(domains) x
  20.9 us (network NVLSTree Simple), the network tree figure of 14 us when a domain holds
  one rank.

What it achieves (what a row of nccl-tests measures): NCCL's estimate runs ahead of the
measurement. The algorithm bandwidth inside a domain is the GPU's NVLink figure x
nvlsEfficiency x ``NVLS_ACHIEVED`` (one factor for both generations, fitted to the corpus's
one-domain H100 rows: 476 GB/s busbw in nccl-tests issue 290, the ~480 GB/s NCCL's
maintainers quote in nccl-tests issue 212; on GB200 it then gives 461 against 442 GB/s
(OCI, 4 GPUs) and 425 GB/s (CoreWeave, 72 GPUs) measured, held out of the fit). Across
domains NVLSTree runs at the NVLS rate, the network's or NCCL's own estimate (whose
per-channel caps are measured figures: 246 GB/s on 2 H100 nodes against 250-259 measured,
188 on 4 against 167-188), whichever is lowest; on two domains the tree's halves each carry
half the data (NCCL's x 2), on more the network carries it all.

Pipeline fill (what runs, not NCCL's estimate): NVLS and NVLSTree move the buffer in loops of
channels x heads chunks (``src/enqueue.cc`` calcCollChunking, 2.23-2.30): 16 channels on
Hopper (``nvls.cc`` NVLS_NCHANNELS_SM90; Blackwell 24 on one domain, 32 in 2.25-2.26, 32 or 24 across), a
128 KiB chunk (NCCL_NVLS_CHUNKSIZE), at most 64 KiB for NVLSTree on 4 or more domains, and
shrunk while the buffer holds few loops (NVLS: 64 KiB under 64 loops, 32 KiB under 8,
16 KiB under 2; NVLSTree: 64 KiB under 4, 32 KiB under 1). A chunk crosses the NVLS
reduction, log2(domains) network levels up and as many down, and the NVLS broadcast before
the pipeline delivers at its steady rate; each of those 2 log2(domains) + 2 stages carries in
steady state an up and a down stream over the same links and runs about twice as fast for
the first chunk alone (our reading, not NCCL's words), so the fill costs 1 + log2(domains) loops' worth of time at the
achieved rate (the whole buffer when it is smaller than a loop). That reading matches the
corpus: on 2 H100 nodes (nccl-tests issue 309) the time less NCCL's latency is (loops + 2)
loops of data at 249 GB/s from 4 MiB to 1 GiB, which is why 32 -> 64 MiB (same loop count,
chunk doubled) doubles the time; on 8 nodes the fill is about 3 loops. Fitted as a check:
a grid of fill = a + b log2(domains), a and b in 0, 0.5, ..., 2, on the corpus's scored
NVLSTree rows (87) puts a = b = 1 best (median |error| 5.8 %, signed +0.6 %; 0 and 1.5 give
5.5 % but -3.4 %). This replaces NCCL's treeCorrectionFactor, which the model applied to
NVLSTree before; on one domain the same loop of fill takes the 32-512 MiB rows of 8 x H100
from -19..-5 % to -10..-2 % (with ``NVLS_CHUNK_US`` since, -5..+4 % across the three H100
tables).
"""

from __future__ import annotations

from treeattn.cost.nccl_channels import SPEEDS_INTER, SPEEDS_INTRA
from treeattn.topology.nccl_version import NEWEST, Release, by_release

__all__ = ["NVLS_EFFICIENCY", "NVLS_ACHIEVED", "NVLS_CHANNELS", "NVLS_CHUNK", "nvls_allreduce", "nvls_graph",
           "nvls_chunk", "nvls_channels", "nvls_fill_bytes", "fill_loops", "chunked_gbps", "NVLS_CHUNK_US",
           "nvls_reduces", "REDUCTION_DTYPES", "REDUCTION_OPS", "DTYPE_ALIASES", "dtype_name"]

# device.h ncclNvlsSupported (the same in v2.19.3 and v2.30): the switch reduces 16-bit floats
# and 32/64-bit integers by sum, min or max, fp32 and fp64 by sum only, nothing else (8-bit
# types, products, averages). nccl-tests' names (REDUCTION_DTYPES; others by DTYPE_ALIASES).
_NVLS_MINMAX = frozenset({"half", "bfloat16", "int32", "uint32", "int64", "uint64"})
_NVLS_SUM_ONLY = frozenset({"float", "double"})
REDUCTION_DTYPES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int32": 4, "uint32": 4,
                    "int64": 8, "uint64": 8, "f8e4m3": 1, "f8e5m2": 1}
"""nccl-tests' data types (``src/common.cu`` test_typenames) and their bytes an element."""
DTYPE_ALIASES = {"fp32": "float", "float32": "float", "fp64": "double", "float64": "double", "fp16": "half",
                 "float16": "half", "bf16": "bfloat16", "fp8": "f8e4m3", "fp8_e4m3": "f8e4m3", "fp8_e5m2": "f8e5m2"}
"""treeattn's, rccl-tests' and other common names of nccl-tests' data types."""
REDUCTION_OPS = ("sum", "prod", "max", "min", "avg", "mulsum")
"""nccl-tests' reduction ops (``src/common.cu`` test_opnames)."""


def dtype_name(name: str) -> str:
    """nccl-tests' name of a data type given by it or an alias (``bf16``: ``bfloat16``), in
    lower case; a name neither knows is returned lower-cased."""
    return DTYPE_ALIASES.get(name.lower(), name.lower())


NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
"""tuning.cc nvlsEfficiency[] by compute capability (Volta and Ampere have no NVLS)."""
NVLS_ACHIEVED = 0.86
"""Measured NVLS algorithm bandwidth over NVLink figure x nvlsEfficiency (module docstring)."""
NVLS_CHANNELS = {("hopper", True): 16, ("hopper", False): 16, ("blackwell", True): 24, ("blackwell", False): 32}
"""nvls.cc NVLS_NCHANNELS_SM90 / _SM100_NVL / _SM100: NCCL's NVLS channels by generation, on
one domain (True) or several, in the newest release (Blackwell on one domain: ``_setup``)."""
# nvls.cc: Blackwell runs NVLS_NCHANNELS_SM100 = 32 channels on one domain too in 2.25-2.26;
# NVLS_NCHANNELS_SM100_NVL = 24 from 2.27.3.
_BLACKWELL_ONE_DOMAIN_CHANNELS = (((2, 25, 1), 32), ((2, 27, 3), 24))
_SM100_TREE_TUNING = (2, 30, 3)
"""The first release with nvls.cc ncclNvlsTreeSm100Tuning (absent in 2.29.7)."""
NVLS_CHUNK = 128 * 1024
"""nvls.cc NCCL_NVLS_CHUNKSIZE default."""
NVLS_CHUNK_US = 3.7
"""What each chunk costs one NVLS channel x head pair beyond its bytes, on one domain (us):
a chunk is one step of NCCL's NVLS pipeline (the multimem reduce and broadcast of the chunk
and the step's handshake), so smaller chunks move the buffer more slowly. NCCL shrinks the
chunk from 128 KiB to 64 KiB below 64 loops of channels x heads chunks (1 GiB on 8 H100s), to
32 KiB below 8 and 16 KiB below 2 (``nvls_chunk``); ``NVLS_ACHIEVED`` is the 128 KiB rate.
The three one-node H100 NVLS tables change pace where the chunk doubles to 128 KiB: from 512
MiB to 1 GiB the model's error went -5 -> +1 % (together-h100-1node), -6 -> 0 % (nccl-tests
issue 290) and -4 -> +1 % (xxrjun) without this cost; Together's also where it doubles to 64
KiB (32 MiB -18 %, 64 MiB -7 %), not where it doubles to 32 KiB (4 MiB -13 %, 8 MiB -15 %).
Fitted on together-h100-1node's nvls table only (its 9 NVLS rows of 2-512 MiB, least squares
of the relative error: 3.72 us), whose 16 KiB rows it then puts 4-8 % slow and its 32 KiB
rows 5-7 % fast: a cost per chunk is the simplest law the two larger steps support, not one
the smallest chunks show. Held out, issue 290's 3 rows of 128-512 MiB would give 5.6 us and
xxrjun's 1-node rows (NCCL 2.29) 2.5. Carried unfitted to Blackwell, whose two one-domain
tables both come closer with it but would each want more (OCI's one row below the full chunk
about 9 us, CoreWeave's rack, 4 rows, about 47). NVLSTree (several domains) is left as it was: its fill was fitted
on its rows, and this cost on its rate (after its caps) takes the 2-node H100 tables' 4-16 MiB
rows from +10 / +18 / +3 to +19 / +22 / +7 % (qoofyk) and from -6 / +3 / -6 to +1 / +7 / -2 %
(gj)."""
# tuning.cc (ncclTopoTuneModel) by release, each figure with the first release (NVIDIA/nccl
# tag) that carries it. perChMaxNVLSTreeBws (Hopper, Blackwell; GB/s per channel on 2 / more
# domains), from 2.28.3, the release whose NVLS/NVLSTree estimate first uses them
# (``_estimate_gbps``).
_PER_CH_TREE = {
    "hopper": (((2, 28, 3), (57.7, 45.5)),),
    "blackwell": (((2, 28, 3), (96.0, 43.1)), ((2, 28, 9), (96.0, 43.8)), ((2, 30, 3), (96.0, 80.0))),
}
_PER_CHANNEL_ESTIMATE = (2, 28, 3)
# hwLat[NVLINK][NVLS and NVLSTree][Simple] (base 0): 23 us in 2.19.1-2.20.5, 25 from 2.21.5.
_LAT_NVLS_US = (((2, 19, 1), 23.0), ((2, 21, 5), 25.0))
# hwLat[NET][NVLSTree][Simple]: 14 us in 2.19.1-2.28.7, 20.9 from 2.28.9.
_LAT_NET_NVLSTREE_US = (((2, 19, 1), 14.0), ((2, 28, 9), 20.9))
# hwLat[NET][Tree][Simple], which 2.23+ charge when a domain holds one rank (2.19-2.22 charge
# NVLSTree's own network figure, 14 us there too).
_LAT_NET_TREE_SIMPLE_US = 14.0
_MAX_NVLS_ARITY = 32


def nvls_reduces(dtype: str, op: str) -> bool:
    """Whether NCCL may run an all-reduce of ``dtype`` by ``op`` on NVLink SHARP (NVLS,
    NVLSTree): ``sum``, ``min`` or ``max`` of half, bfloat16 and 32/64-bit integers, ``sum``
    of float and double, nothing of 8-bit types, ``prod`` or ``avg`` (``src/include/device.h``
    ncclNvlsSupported, which ``src/enqueue.cc`` asks before choosing an algorithm); otherwise
    NCCL runs a ring or a tree."""
    dtype, op = dtype_name(dtype), op.lower()
    if dtype in _NVLS_SUM_ONLY:
        return op == "sum"
    return dtype in _NVLS_MINMAX and op in ("sum", "min", "max")


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


def nvls_allreduce(arch: str, ranks: int, domains: int, link_gbps: float, inter_gbps: float,
                   nbytes: int, net_achieved: float = 1.0,
                   release: Release = NEWEST) -> tuple[str, float, float, float] | None:
    """NVLS (one domain) or NVLSTree (several) for an all-reduce of ``nbytes``.

    Args:
        arch: hopper or blackwell (others: None).
        ranks: ranks in the communicator.
        domains: NVLink domains (NCCL's nodes).
        link_gbps: a GPU's NVLink bandwidth as NCCL rates it (all its links).
        inter_gbps: a domain's network bandwidth (NCCL's figure); unused on one domain.
        nbytes: buffer size.
        net_achieved: the share of ``inter_gbps`` the Simple protocol achieves.
        release: the NCCL release (``treeattn.topology.nccl_version``) whose latencies and
            estimate apply, and Blackwell's NVLS channels on one domain; what runs is
            otherwise the same in every release.

    Returns:
        (algorithm, NCCL's estimate us, achieved us, latency us), or None without NVLS.
    """
    eff = NVLS_EFFICIENCY.get(arch)
    if eff is None or link_gbps <= 0 or ranks < 2:
        return None
    gpus, nic_gbps = _per_domain(ranks, domains, inter_gbps)
    ppn = ranks / domains
    to_alg = ranks / (2.0 * (ranks - 1))
    heads, speed = nvls_graph(arch, domains, gpus, link_gbps, nic_gbps)
    if heads < 2:
        return None
    estimate = _estimate_gbps(arch, domains, heads, speed, to_alg, release)
    achieved = link_gbps * eff * NVLS_ACHIEVED
    ops, chunk = _chunking(arch, domains, heads, gpus, nic_gbps, nbytes, release)
    fill = _fill_bytes(domains, ops, chunk, nbytes)
    lat = by_release(_LAT_NVLS_US, release)
    if domains == 1:
        name = "nvls"
        achieved = chunked_gbps(achieved, ops, chunk)
    else:
        # NCCL's newest per-channel NVLSTree caps are measured figures: what runs stays under
        # them, whichever release's estimate picks the algorithm.
        measured = _estimate_gbps(arch, domains, heads, speed, to_alg, NEWEST)
        achieved = min(achieved, inter_gbps * net_achieved * _spread(domains) * to_alg, measured)
        net = _LAT_NET_TREE_SIMPLE_US if ppn == 1 else by_release(_LAT_NET_NVLSTREE_US, release)
        lat += 2 * _log2i(domains) * net
        name = "nvlstree"
    nccl_us = lat + nbytes / (estimate * 1e3)
    return name, nccl_us, lat + (nbytes + fill) / (achieved * 1e3), lat


def _estimate_gbps(arch: str, domains: int, heads: int, speed: float, to_alg: float, release: Release) -> float:
    """NCCL's NVLS (one domain) or NVLSTree algorithm bandwidth in ``release`` (tuning.cc
    ncclTopoTuneModel) on its NVLS graph of ``heads`` channels at ``speed`` GB/s.

    From 2.28.3: per channel speed x nvlsEfficiency x (heads - 1) / heads x 2 (all-reduce),
    NVLSTree at most the network speed (x 2 on two domains) and perChMaxNVLSTreeBw, times
    the channels and R / (2(R - 1)). In 2.19.1-2.28.2: per channel min(bwIntra, bwInter) (the
    graph's one speed), for NVLSTree halved beyond two domains, times the channels and 5/6,
    without per-channel caps."""
    if release < _PER_CHANNEL_ESTIMATE:
        return heads * (speed if domains <= 2 else speed / 2) * 5.0 / 6.0
    per_ch = speed * NVLS_EFFICIENCY[arch] * (heads - 1) / heads * 2.0
    if domains > 1:
        cap = by_release(_PER_CH_TREE[arch], release)[0 if domains <= 2 else 1]
        per_ch = min(per_ch, speed * _spread(domains), cap)
    return heads * per_ch * to_alg


def chunked_gbps(gbps: float, ops: int, chunk: int) -> float:
    """NVLS's achieved rate ``gbps`` (NCCL's full ``NVLS_CHUNK``) with ``chunk``-byte chunks
    shared by ``ops`` channel x head pairs, each chunk costing ``NVLS_CHUNK_US`` beyond its
    bytes (the full chunk's share of that cost is in ``gbps`` already)."""
    return 1.0 / (1.0 / gbps + 1e3 * NVLS_CHUNK_US / ops * (1.0 / chunk - 1.0 / NVLS_CHUNK))


def _per_domain(ranks: int, domains: int, inter_gbps: float) -> tuple[int, float]:
    """GPUs of a domain and the network bandwidth of each."""
    ppn = ranks / domains
    return max(int(round(ppn)), 1), inter_gbps / max(ppn, 1.0)


def nvls_channels(arch: str, ranks: int, domains: int, inter_gbps: float, release: Release = NEWEST) -> int:
    """Channels NCCL runs an NVLS or NVLSTree all-reduce on: the communicator's NVLS channels,
    whatever the size (enqueue.cc topoGetAlgoInfo; ``_setup``)."""
    gpus, nic_gbps = _per_domain(ranks, domains, inter_gbps)
    return _setup(arch, domains, gpus, nic_gbps, release)[0]


def _spread(domains: int) -> float:
    """NVLSTree's network rate over a domain's network speed, as tuning.cc rates it: x2 on two
    domains, x1 beyond."""
    return 2.0 if domains <= 2 else 1.0


def _setup(arch: str, domains: int, ppn: int, nic_gbps: float, release: Release = NEWEST) -> tuple[int, int, int]:
    """NCCL's NVLS channels, chunk and NVLSTree's largest chunk (bytes) for a communicator
    (nvls.cc ncclNvlsTuning; Blackwell across domains from 2.30.3: ncclNvlsTreeSm100Tuning, its
    GPU-to-NIC path taken as closer than PXB; before, every GPU across domains as below, with
    enqueue.cc's NVLSTree chunk of at most 64 KiB on 4 or more domains)."""
    if domains == 1:
        if arch == "blackwell":
            return by_release(_BLACKWELL_ONE_DOMAIN_CHANNELS, release), NVLS_CHUNK, NVLS_CHUNK
        return NVLS_CHANNELS[(arch, True)], NVLS_CHUNK, NVLS_CHUNK
    newer = arch == "blackwell" and release >= _SM100_TREE_TUNING
    tuned = _sm100_tree_tuning(domains, ppn, nic_gbps) if newer else None
    return tuned or (NVLS_CHANNELS[(arch, False)], NVLS_CHUNK, 64 * 1024 if domains >= 4 else NVLS_CHUNK)


def _sm100_tree_tuning(domains: int, ppn: int, nic_gbps: float) -> tuple[int, int, int] | None:
    """nvls.cc ncclNvlsTreeSm100Tuning (2.30.3 on): Blackwell's NVLS channels, chunk and
    NVLSTree's largest chunk across domains, by domains, GPUs a domain and NIC bandwidth; None
    where it keeps the defaults."""
    if domains == 2 and nic_gbps >= 48.0:
        if ppn <= 4:
            return 32, 2 * NVLS_CHUNK, 2 * NVLS_CHUNK
        return 32, NVLS_CHUNK, 64 * 1024 if ppn >= 16 else NVLS_CHUNK
    if nic_gbps >= 96.0:
        if ppn <= 8:
            return 24, 2 * NVLS_CHUNK, 2 * NVLS_CHUNK
        return 32, NVLS_CHUNK, NVLS_CHUNK if ppn < 32 else 64 * 1024
    if nic_gbps >= 48.0:
        return 24, NVLS_CHUNK, NVLS_CHUNK
    return None


def nvls_chunk(domains: int, ops: int, chunk: int, max_chunk: int, nbytes: int) -> int:
    """enqueue.cc calcCollChunking: NVLS (one domain) and NVLSTree shrink their chunk below a
    few loops' worth of the buffer (a loop: ``ops`` = channels x heads chunks at once). On one
    domain NCCL applies it per channel, to the channel's share of the buffer with one channel's
    heads (scheduleCollTasksToPlan, 2.26); with the buffer shared evenly that is this rule."""
    if domains == 1:
        steps = ((64, 65536), (8, 32768), (2, 16384))
    else:
        chunk = min(chunk, max_chunk)
        steps = ((32, 262144), (16, 131072), (4, 65536), (1, 32768))
    for loops, size in steps:
        if nbytes < loops * ops * chunk and chunk > size:
            chunk = size
    return chunk


def fill_loops(domains: int) -> float:
    """Loops' worth of time NVLS(Tree) spends filling its pipeline (module docstring)."""
    return 1.0 + _log2i(domains)


def nvls_fill_bytes(arch: str, domains: int, heads: int, ppn: int, nic_gbps: float, nbytes: int,
                    release: Release = NEWEST) -> float:
    """The pipeline fill as bytes at the achieved rate: ``fill_loops`` loops of channels x
    heads chunks, or the whole buffer when it is smaller than one loop."""
    return _fill_bytes(domains, *_chunking(arch, domains, heads, ppn, nic_gbps, nbytes, release), nbytes)


def _chunking(arch: str, domains: int, heads: int, ppn: int, nic_gbps: float, nbytes: int,
              release: Release) -> tuple[int, int]:
    """The channel x head pairs NCCL runs at once and the chunk each moves (bytes)."""
    channels, chunk, max_chunk = _setup(arch, domains, ppn, nic_gbps, release)
    ops = channels * heads
    return ops, nvls_chunk(domains, ops, chunk, max_chunk, nbytes)


def _fill_bytes(domains: int, ops: int, chunk: int, nbytes: int) -> float:
    return fill_loops(domains) * min(nbytes, ops * chunk)


def nvls_graph(arch: str, domains: int, gpus: int, link_gbps: float, nic_gbps: float = 0.0) -> tuple[int, float]:
    """NCCL's NVLS graph (search.cc): one channel per GPU of a domain (its heads, at most
    NCCL_MAX_NVLS_ARITY = 32), at the fastest speed of NCCL's list that a GPU's NVLink carries
    with every head at once (a head's traffic spread over the other GPUs: the GPU's
    bandwidth x heads / (heads - 1)), and across domains that a NIC carries."""
    heads = min(_MAX_NVLS_ARITY, gpus)
    if heads < 2:
        return heads, 0.0
    if domains > 1:
        speeds = SPEEDS_INTER[arch if arch in SPEEDS_INTER else "other"]
        cap = min(link_gbps, nic_gbps) if nic_gbps > 0 else link_gbps
    else:
        speeds = SPEEDS_INTRA[arch if arch in SPEEDS_INTRA else "other"]
        cap = link_gbps
    total = link_gbps * heads / (heads - 1)
    speed = next((x for x in speeds if x <= cap and x * heads <= total), speeds[-1])
    return heads, speed
