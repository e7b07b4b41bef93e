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
half the data (NCCL's x 2), on more the network carries it all;
and at medium sizes it falls short as NCCL's trees do, by NCCL's treeCorrectionFactor for
Simple (which ``tuning.cc`` itself applies to NVLSTree on Blackwell x86 hosts): the
corpus's 2-8-node H100 rows of 8-128 MiB run 25-35 % slower than the steady rate.
"""

from __future__ import annotations

from treeattn.cost.nccl_channels import SPEEDS_INTER, SPEEDS_INTRA

__all__ = ["NVLS_EFFICIENCY", "NVLS_ACHIEVED", "nvls_allreduce", "nvls_graph"]

NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
"""tuning.cc nvlsEfficiency[] by compute capability (Volta and Ampere have no NVLS)."""
NVLS_ACHIEVED = 0.86
"""Measured NVLS algorithm bandwidth over NVLink figure x nvlsEfficiency (module docstring)."""
_PER_CH_TREE = {"hopper": (57.7, 45.5), "blackwell": (96.0, 80.0)}
_LAT_NVLS_US = 25.0
_LAT_NET_NVLSTREE_US = 20.9
_LAT_NET_TREE_SIMPLE_US = 14.0
_MAX_NVLS_ARITY = 32


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


def nvls_allreduce(arch: str, ranks: int, domains: int, link_gbps: float, inter_gbps: float,
                   nbytes: int, net_achieved: float = 1.0,
                   tree_correction: float = 1.0) -> tuple[str, float, float, float] | None:
    """NVLS (one domain) or NVLSTree (several) for an all-reduce of ``nbytes``.

    Args:
        arch: hopper or blackwell (others: None).
        ranks: ranks in the communicator.
        domains: NVLink domains (NCCL's nodes).
        link_gbps: a GPU's NVLink bandwidth as NCCL rates it (all its links).
        inter_gbps: a domain's network bandwidth (NCCL's figure); unused on one domain.
        nbytes: buffer size.
        net_achieved: the share of ``inter_gbps`` the Simple protocol achieves.
        tree_correction: NCCL's treeCorrectionFactor (Simple) at this size, which NVLSTree
            achieves of its bandwidth (tuning.cc applies it to NVLSTree on Blackwell hosts).

    Returns:
        (algorithm, NCCL's estimate us, achieved us, latency us), or None without NVLS.
    """
    eff = NVLS_EFFICIENCY.get(arch)
    if eff is None or link_gbps <= 0 or ranks < 2:
        return None
    ppn = ranks / domains
    to_alg = ranks / (2.0 * (ranks - 1))
    heads, speed = nvls_graph(arch, domains, max(int(round(ppn)), 1), link_gbps, inter_gbps / max(ppn, 1.0))
    if heads < 2:
        return None
    # tuning.cc: per channel bwIntra x nvlsEfficiency x (channels - 1) / channels, x2 for
    # all-reduce, times the graph's channels (its heads).
    per_ch = speed * eff * (heads - 1) / heads * 2.0
    achieved = link_gbps * eff * NVLS_ACHIEVED
    if domains == 1:
        lat = _LAT_NVLS_US
        name = "nvls"
    else:
        spread = 2.0 if domains <= 2 else 1.0
        per_ch = min(per_ch, speed * spread, _PER_CH_TREE[arch][0 if domains <= 2 else 1])
        # NCCL's per-channel NVLSTree caps are measured figures: what runs stays under them.
        achieved = min(achieved, inter_gbps * net_achieved * spread * to_alg,
                       heads * per_ch * to_alg) * tree_correction
        net = _LAT_NET_TREE_SIMPLE_US if ppn == 1 else _LAT_NET_NVLSTREE_US
        lat = _LAT_NVLS_US + 2 * _log2i(domains) * net
        name = "nvlstree"
    nccl_us = lat + nbytes / (heads * per_ch * to_alg * 1e3)
    return name, nccl_us, lat + nbytes / (achieved * 1e3), lat


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
