"""NVLink SHARP all-reduce (NCCL's NVLS and NVLSTree algorithms), as NCCL rates it and as it runs.

On Hopper and Blackwell GPUs behind NVSwitches NCCL (2.17+) reduces inside the switch:
every GPU loads the sum of its share from the switch (multimem.ld_reduce) and stores it
back to every GPU at once (multimem.st). One NVLink domain runs NVLS; several domains run
NVLSTree: NVLS inside each domain, a tree across them over the network. NCCL offers both
for all-reduce with the Simple protocol only (``src/graph/tuning.cc``, v2.30), and NVLS
for all-gather and reduce-scatter on one domain (not modelled here: no published table).

NCCL's own estimate (what it picks by), from ``tuning.cc``:

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
Hopper (``nvls.cc`` NVLS_NCHANNELS_SM90; Blackwell 24 on one domain, 32 or 24 across), a
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
from -19..-5 % to -10..-2 %.
"""

from __future__ import annotations

from treeattn.cost.nccl_channels import SPEEDS_INTER, SPEEDS_INTRA

__all__ = ["NVLS_EFFICIENCY", "NVLS_ACHIEVED", "NVLS_CHANNELS", "NVLS_CHUNK", "nvls_allreduce", "nvls_graph",
           "nvls_chunk", "nvls_fill_bytes", "fill_loops"]

NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
"""tuning.cc nvlsEfficiency[] by compute capability (Volta and Ampere have no NVLS)."""
NVLS_ACHIEVED = 0.86
"""Measured NVLS algorithm bandwidth over NVLink figure x nvlsEfficiency (module docstring)."""
NVLS_CHANNELS = {("hopper", True): 16, ("hopper", False): 16, ("blackwell", True): 24, ("blackwell", False): 32}
"""nvls.cc NVLS_NCHANNELS_SM90 / _SM100_NVL / _SM100: NCCL's NVLS channels by generation, on
one domain (True) or several."""
NVLS_CHUNK = 128 * 1024
"""nvls.cc NCCL_NVLS_CHUNKSIZE default."""
_PER_CH_TREE = {"hopper": (57.7, 45.5), "blackwell": (96.0, 80.0)}
_LAT_NVLS_US = 25.0
_LAT_NET_NVLSTREE_US = 20.9
_LAT_NET_TREE_SIMPLE_US = 14.0
_MAX_NVLS_ARITY = 32


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


def nvls_allreduce(arch: str, ranks: int, domains: int, link_gbps: float, inter_gbps: float,
                   nbytes: int, net_achieved: float = 1.0) -> tuple[str, float, float, float] | None:
    """NVLS (one domain) or NVLSTree (several) for an all-reduce of ``nbytes``.

    Args:
        arch: hopper or blackwell (others: None).
        ranks: ranks in the communicator.
        domains: NVLink domains (NCCL's nodes).
        link_gbps: a GPU's NVLink bandwidth as NCCL rates it (all its links).
        inter_gbps: a domain's network bandwidth (NCCL's figure); unused on one domain.
        nbytes: buffer size.
        net_achieved: the share of ``inter_gbps`` the Simple protocol achieves.

    Returns:
        (algorithm, NCCL's estimate us, achieved us, latency us), or None without NVLS.
    """
    eff = NVLS_EFFICIENCY.get(arch)
    if eff is None or link_gbps <= 0 or ranks < 2:
        return None
    ppn = ranks / domains
    gpus, nic_gbps = max(int(round(ppn)), 1), inter_gbps / max(ppn, 1.0)
    to_alg = ranks / (2.0 * (ranks - 1))
    heads, speed = nvls_graph(arch, domains, gpus, link_gbps, nic_gbps)
    if heads < 2:
        return None
    # tuning.cc: per channel bwIntra x nvlsEfficiency x (channels - 1) / channels, x2 for
    # all-reduce, times the graph's channels (its heads).
    per_ch = speed * eff * (heads - 1) / heads * 2.0
    achieved = link_gbps * eff * NVLS_ACHIEVED
    fill = nvls_fill_bytes(arch, domains, heads, gpus, nic_gbps, nbytes)
    if domains == 1:
        lat = _LAT_NVLS_US
        name = "nvls"
    else:
        spread = 2.0 if domains <= 2 else 1.0
        per_ch = min(per_ch, speed * spread, _PER_CH_TREE[arch][0 if domains <= 2 else 1])
        # NCCL's per-channel NVLSTree caps are measured figures: what runs stays under them.
        achieved = min(achieved, inter_gbps * net_achieved * spread * to_alg, heads * per_ch * to_alg)
        net = _LAT_NET_TREE_SIMPLE_US if ppn == 1 else _LAT_NET_NVLSTREE_US
        lat = _LAT_NVLS_US + 2 * _log2i(domains) * net
        name = "nvlstree"
    nccl_us = lat + nbytes / (heads * per_ch * to_alg * 1e3)
    return name, nccl_us, lat + (nbytes + fill) / (achieved * 1e3), lat


def _setup(arch: str, domains: int, ppn: int, nic_gbps: float) -> tuple[int, int, int]:
    """NCCL's NVLS channels, chunk and NVLSTree's largest chunk (bytes) for a communicator
    (nvls.cc ncclNvlsTuning; Blackwell across domains: ncclNvlsTreeSm100Tuning, 2.30, its
    GPU-to-NIC path taken as closer than PXB)."""
    if domains == 1:
        return NVLS_CHANNELS[(arch, True)], NVLS_CHUNK, NVLS_CHUNK
    if arch == "blackwell" and domains == 2 and nic_gbps >= 48.0:
        if ppn <= 4:
            return 32, 2 * NVLS_CHUNK, 2 * NVLS_CHUNK
        return 32, NVLS_CHUNK, 64 * 1024 if ppn >= 16 else NVLS_CHUNK
    if arch == "blackwell" and nic_gbps >= 96.0:
        if ppn <= 8:
            return 24, 2 * NVLS_CHUNK, 2 * NVLS_CHUNK
        return 32, NVLS_CHUNK, NVLS_CHUNK if ppn < 32 else 64 * 1024
    if arch == "blackwell" and nic_gbps >= 48.0:
        return 24, NVLS_CHUNK, NVLS_CHUNK
    return NVLS_CHANNELS[(arch, False)], NVLS_CHUNK, 64 * 1024 if domains >= 4 else NVLS_CHUNK


def nvls_chunk(domains: int, ops: int, chunk: int, max_chunk: int, nbytes: int) -> int:
    """enqueue.cc calcCollChunking: NVLS (one domain) and NVLSTree shrink their chunk below a
    few loops' worth of the buffer (a loop: ``ops`` = channels x heads chunks at once)."""
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


def nvls_fill_bytes(arch: str, domains: int, heads: int, ppn: int, nic_gbps: float, nbytes: int) -> float:
    """The pipeline fill as bytes at the achieved rate: ``fill_loops`` loops of channels x
    heads chunks, or the whole buffer when it is smaller than one loop."""
    channels, chunk, max_chunk = _setup(arch, domains, ppn, nic_gbps)
    ops = channels * heads
    loop = ops * nvls_chunk(domains, ops, chunk, max_chunk, nbytes)
    return fill_loops(domains) * min(nbytes, loop)


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
