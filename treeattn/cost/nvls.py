"""NVLink SHARP all-reduce (NCCL's NVLS and NVLSTree algorithms), as NCCL rates it and as it runs.

On Hopper and Blackwell GPUs behind NVSwitches NCCL (2.17+) reduces inside the switch:
every GPU loads the sum of its share from the switch (multimem.ld_reduce) and stores it
back to every GPU at once (multimem.st). One NVLink domain runs NVLS; several domains run
NVLSTree: NVLS inside each domain, a tree across them over the network. NCCL offers both
for all-reduce with the Simple protocol only (``src/graph/tuning.cc``, v2.30), and NVLS
for all-gather and reduce-scatter on one domain (not modelled here: no published table).

NCCL's own estimate (what it picks by), from ``tuning.cc``:

* channels: 16 on Hopper, 24 on one Blackwell domain, 32 on several
  (``src/transport/nvls.cc`` NVLS_NCHANNELS_SM90 / _SM100_NVL / _SM100);
* intra bandwidth = the GPU's NVLink figure x nvlsEfficiency (Hopper 0.85, Blackwell 0.74)
  x (channels - 1) / channels, x 2 for all-reduce ("AllReduce pipelines two operations");
  NVLSTree: also at most the network (x 2 on two domains) and at most perChMaxNVLSTreeBw x
  channels (Hopper 57.7 / 45.5, Blackwell 96 / 80 GB/s per channel on 2 / more domains);
  algorithm bandwidth = that x R / (2(R - 1));
* latency: NVLS 25 us (NVLink NVLS Simple hop, base 0); NVLSTree 25 + 2 log2(domains) x
  20.9 us (network NVLSTree Simple), the network tree figure of 14 us when a domain holds
  one rank.

What it achieves (what a row of nccl-tests measures): NCCL's estimate runs ahead of the
measurement. The algorithm bandwidth inside a domain is the GPU's NVLink figure x
nvlsEfficiency x ``NVLS_ACHIEVED`` (one factor for both generations, fitted to the corpus's
one-domain H100 rows: 476 GB/s busbw in nccl-tests issue 290, the ~480 GB/s NCCL's
maintainers quote in nccl-tests issue 212; on GB200 it then gives 461 against 442 GB/s
(OCI, 4 GPUs) and 425 GB/s (CoreWeave, 72 GPUs) measured, held out of the fit). Across
domains NVLSTree runs at the NVLS rate or the network's, whichever is lower; on two domains
the tree's halves each carry half the data (NCCL's x 2), on more the network carries it all;
and at medium sizes it falls short as NCCL's trees do, by NCCL's treeCorrectionFactor for
Simple (which ``tuning.cc`` itself applies to NVLSTree on Blackwell x86 hosts): the
corpus's 2-8-node H100 rows of 8-128 MiB run 25-35 % slower than the steady rate.
"""

from __future__ import annotations

__all__ = ["NVLS_EFFICIENCY", "NVLS_ACHIEVED", "nvls_channels", "nvls_allreduce"]

NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
"""tuning.cc nvlsEfficiency[] by compute capability (Volta and Ampere have no NVLS)."""
NVLS_ACHIEVED = 0.86
"""Measured NVLS algorithm bandwidth over NVLink figure x nvlsEfficiency (module docstring)."""
_PER_CH_TREE = {"hopper": (57.7, 45.5), "blackwell": (96.0, 80.0)}
_LAT_NVLS_US = 25.0
_LAT_NET_NVLSTREE_US = 20.9
_LAT_NET_TREE_SIMPLE_US = 14.0


def nvls_channels(arch: str, domains: int) -> int:
    """NCCL's NVLS channel count (src/transport/nvls.cc)."""
    if arch == "blackwell":
        return 32 if domains > 1 else 24
    return 16


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
    nch = nvls_channels(arch, domains)
    ppn = ranks / domains
    to_alg = ranks / (2.0 * (ranks - 1))
    bus = link_gbps * eff * (nch - 1) / nch * 2.0
    achieved = link_gbps * eff * NVLS_ACHIEVED
    if domains == 1:
        lat = _LAT_NVLS_US
        name = "nvls"
    else:
        spread = 2.0 if domains <= 2 else 1.0
        per_ch = _PER_CH_TREE[arch][0 if domains <= 2 else 1]
        bus = min(bus, inter_gbps * spread, per_ch * nch)
        achieved = min(achieved, inter_gbps * net_achieved * spread * to_alg) * tree_correction
        net = _LAT_NET_TREE_SIMPLE_US if ppn == 1 else _LAT_NET_NVLSTREE_US
        lat = _LAT_NVLS_US + 2 * _log2i(domains) * net
        name = "nvlstree"
    nccl_us = lat + nbytes / (bus * to_alg * 1e3)
    return name, nccl_us, lat + nbytes / (achieved * 1e3), lat
