"""How many channels NCCL builds for a communicator, and how many it runs at a given size.

A channel is one CUDA block per rank working on its share of the buffer; NCCL's bandwidth
figures (``treeattn.cost.nccl``) are those of every channel at once. Below a size, NCCL
runs fewer channels (``src/enqueue.cc``, ``topoGetAlgoInfo``): while the buffer is smaller
than ``channels x threads x threshold`` bytes it drops one channel, so a 64 KiB all-reduce
on 8 GPUs runs on 2 of 24 channels. NCCL's own estimate leaves this out (it picks by the
full bandwidth); the time a size takes does not. The figures, from NCCL 2.19-2.30:

* threads per block (``src/include/device.h``, ``src/graph/tuning.cc``): LL 512, LL128 640,
  Simple 512 (256 when the ring's bandwidth is at most PCI_BW = 12 GB/s);
* per-thread threshold (``src/include/comm.h``): LL 8 bytes (x ranks for the ring), LL128 8,
  Simple 64.

The communicator's channel count follows NCCL's topology search (``src/graph/search.cc``,
``src/graph/connect.cc``), summarized:

* one node: the search takes the fastest speed of NCCL's list (by GPU generation) that a
  GPU's path to a peer can carry, and as many channels of it as the GPU's links hold;
* several nodes: one channel per NIC of a node at the fastest network speed of the list
  the NIC and GPU carry;
* then ``ncclTopoDupChannels`` doubles them when a channel is fast (at least 25 GB/s, and on
  Hopper and newer at least 50 GB/s or at most 4 channels), ``ncclTopoPostset`` doubles them
  again, and on Hopper and newer across nodes a ring faster than 45 GB/s per channel with
  fewer than 16 channels is doubled once more (at most 64 channels, 32 per search).
"""

from __future__ import annotations

__all__ = ["SPEEDS_INTRA", "SPEEDS_INTER", "P2P_NET_CHANNEL_GBPS", "P2P_NVL_CHUNK", "comm_channels", "graph_channels",
           "run_channels",
           "p2p_channels", "pow2_up"]

MAX_CHANNELS = 64
# search.cc speedArrayIntra / sm90SpeedArrayIntra / sm100SpeedArrayIntra (GB/s per channel).
SPEEDS_INTRA = {
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "other": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
}
# search.cc speedArrayInter and its sm90 / sm100 variants.
SPEEDS_INTER = {
    "blackwell": (96.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2),
    "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2),
    "other": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2),
}
_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
_PCI_BW = 12.0


def _row(arch: str) -> str:
    return arch if arch in ("hopper", "blackwell") else "other"


def graph_channels(arch: str, nodes: int, path_gbps: float, gpu_gbps: float, nics: int = 0,
                   nic_gbps: float = 0.0) -> tuple[int, float]:
    """The channels of NCCL's ring/tree graph and the speed of each (GB/s), as its search
    and ``ncclTopoDupChannels`` leave them (before ``ncclTopoPostset`` doubles them): what
    ``tuning.cc`` multiplies its per-channel caps by. Arguments as ``comm_channels``."""
    if nodes > 1 and nics > 0:
        cap = min(nic_gbps, gpu_gbps) if gpu_gbps > 0 else nic_gbps
        speed = next((s for s in SPEEDS_INTER[_row(arch)] if s <= cap), SPEEDS_INTER[_row(arch)][-1])
        n = min(MAX_CHANNELS // 2, nics)
    else:
        speeds = SPEEDS_INTRA[_row(arch)]
        speed = next((s for s in speeds if s <= path_gbps), speeds[-1])
        n = max(1, min(MAX_CHANNELS // 2, int(gpu_gbps // speed))) if gpu_gbps > 0 else 1
    modern = arch in ("hopper", "blackwell")
    if speed >= 25.0 and not (modern and speed < 50.0 and n > 4):
        n, speed = min(2 * n, MAX_CHANNELS // 2), speed / 2  # ncclTopoDupChannels
    return n, speed


def comm_channels(arch: str, nodes: int, path_gbps: float, gpu_gbps: float, nics: int = 0,
                  nic_gbps: float = 0.0) -> tuple[int, float]:
    """NCCL's ring channel count and its search bandwidth (GB/s, all channels) for one communicator.

    Args:
        arch: GPU generation (volta, ampere, hopper, blackwell).
        nodes: NCCL's nodes.
        path_gbps: the fastest path from a GPU to one peer of its node, as NCCL rates it.
        gpu_gbps: the GPU's intra-node bandwidth, all links.
        nics: NICs of a node the ring uses (several nodes).
        nic_gbps: one NIC's bandwidth.
    """
    n, speed = graph_channels(arch, nodes, path_gbps, gpu_gbps, nics, nic_gbps)
    total = n * speed
    n = min(MAX_CHANNELS, 2 * n)  # ncclTopoPostset
    if arch in ("hopper", "blackwell") and nodes > 1 and speed > 45.0 and n < 16:
        n *= 2
    return n, total


def run_channels(channels: int, protocol: str, nbytes: int, ranks: int, ring_ll: bool,
                 ring_gbps: float = 0.0) -> int:
    """Channels NCCL runs a ring or tree collective of ``nbytes`` on (enqueue.cc)."""
    threads = _THREADS[protocol]
    if protocol == "Simple" and 0 < ring_gbps <= _PCI_BW:
        threads = 256
    threshold = _THRESHOLD[protocol] * (ranks if ring_ll and protocol == "LL" else 1)
    nc = channels
    while nc >= 2 and nbytes < nc * threads * threshold:
        nc -= 1
    return nc


# Point-to-point (send/recv) channels, NCCL 2.19-2.30 (src/graph/paths.cc, src/enqueue.cc
# addP2pToPlan and scheduleP2pTasksToPlan): counts are rounded up to powers of two, the
# communicator's p2p channels are its channels rounded up (at most 32, or 64 past 32); across
# nodes the per-peer count is halved until the peers of one batch of
# NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8 ranks fit them. A message is cut into parts of at least
# chunk / 8 (one node) or chunk / 2 (several nodes) on the fewest channels that keep every
# part under 32 chunks (one node) or one chunk (several), starting from the per-peer count
# shrunk until every rank's peer fits the p2p channels at once. The per-peer counts and the
# chunk are in treeattn.cost.nccl_p2p.
P2P_NET_CHANNEL_GBPS = 14.0
"""paths.cc P2P_PER_CHANNEL_NET_BW (GB/s): NCCL gives a network peer one channel per this much."""
P2P_NVL_CHUNK = 1 << 19


def pow2_up(n: int) -> int:
    """The least power of two at least ``n`` (1 for ``n`` <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def p2p_channels(comm: int, nbytes: int, ranks: int, nodes: int, per_peer: int, chunk: int = P2P_NVL_CHUNK) -> int:
    """Channels NCCL moves one send of ``nbytes`` on, in an exchange where every rank sends
    to one peer (nccl-tests sendrecv; an all-to-all round).

    Args:
        comm: the communicator's channels (``comm_channels``).
        nbytes: the message.
        ranks: ranks of the communicator.
        nodes: NCCL's nodes.
        per_peer: the channels NCCL gives a peer in this communicator.
        chunk: NCCL's point-to-point chunk in this communicator (``comm->p2pChunkSize``).
    """
    p2p = min(MAX_CHANNELS // 2 if comm <= MAX_CHANNELS // 2 else MAX_CHANNELS, pow2_up(max(comm, 1)))
    n_max = pow2_up(max(per_peer, 1))
    if nodes > 1:
        # paths.cc: across nodes the per-peer count shrinks until the peers of one batch of
        # NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8 fit the p2p channels.
        while n_max * -(-ranks // 8) > p2p and n_max > 1:
            n_max //= 2
    else:
        n_max = min(n_max, p2p)
    n_min = n_max
    while n_min * ranks > p2p and n_min > 1:
        n_min //= 2
    min_part = chunk // 2 if nodes > 1 else chunk // 8
    max_part = chunk if nodes > 1 else chunk * 32
    n = max(1, min(n_min, -(-nbytes // min_part)))
    part = max(min_part, -(-nbytes // n))
    while part > max_part and n <= n_max // 2:
        n *= 2
        part = -(-nbytes // n)
    return n
