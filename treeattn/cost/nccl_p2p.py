"""How fast NCCL moves one point-to-point message (send/recv), by the channels it runs it on.

NCCL cuts a send into parts over a number of channels that grows with the message
(``treeattn.cost.nccl_channels.p2p_channels``), and each channel moves about one link's
worth: a 32-64 MiB send between two H100s runs on 4 channels at 80-82 GB/s, 128 MiB on 8 at
162 GB/s, 256 MiB on 16 at 300 GB/s (results/published, xxrjun-nccl-tests-cluster), far
below the 370 GB/s of the GPU's NVLink. The simulator (``treeattn.cost.simulate``) caps
flows by their links only; this is the per-message cap it would apply (docs/nccl-model.md
gives the proposed change and its effect on the published sendrecv tables).
"""

from __future__ import annotations

import math

from treeattn.cost import nccl
from treeattn.cost.nccl_channels import P2P_NET_CHANNEL_GBPS, p2p_channels
from treeattn.topology.model import Link, LinkClass, Topology

__all__ = ["p2p_message_gbps", "routes_on_fabric"]


def p2p_message_gbps(topo: Topology, fab: nccl.NcclFabric, src: int, dst: int, nbytes: int) -> float:
    """The most one send of ``nbytes`` from rank ``src`` to ``dst`` reaches under NCCL: the
    channels NCCL moves it on (``nccl_channels.p2p_channels``) times what one channel
    moves: NCCL's per-link NVLink figure over NVLink (20.6 GB/s on Hopper; an 8-GPU H100
    node measures 20.0-20.5 per channel at 4-8 channels, results/published), its PCIe
    rating over PCIe, ``P2P_NET_CHANNEL_GBPS`` over the network. Not yet applied by the
    simulator (``cost.simulate`` caps flows by links only); see docs/nccl-model.md."""
    a, b = topo.rank_device(src), topo.rank_device(dst)
    arch = nccl._arch(a.model or "")
    out: dict[str, list[Link]] = {}
    for ln in topo.links:
        out.setdefault(ln.src, []).append(ln)
    links = out.get(a.name, [])
    if routes_on_fabric(topo, src, dst):
        path = nccl._peer_path_gbps(topo, links, arch)
        nvl = [ln for ln in links if ln.cls is LinkClass.GPU_FABRIC]
        per_link = nccl.nccl_link_bw_gbps(nvl[0], arch) / max(nvl[0].count, 1) if nvl else path
        per_peer, per_channel = 2 * max(1, int(path / per_link + 1e-9)), per_link
    elif a.node == b.node:
        path = nccl._peer_path_gbps(topo, links, arch)
        per_peer, per_channel = 2, path
    else:
        nic = nccl._nic_bw(out, a.nic) if a.nic else 0.0
        per_peer, per_channel = max(1, math.ceil(nic / P2P_NET_CHANNEL_GBPS)), P2P_NET_CHANNEL_GBPS
    n = p2p_channels(fab.channels or 1, nbytes, fab.ranks, fab.nodes, per_peer)
    return n * per_channel


def routes_on_fabric(topo: Topology, src: int, dst: int) -> bool:
    """Whether the route between two ranks stays on GPU fabric links (NVLink, xGMI)."""
    return all(topo.links[i].cls is LinkClass.GPU_FABRIC for i in topo.route(src, dst))
