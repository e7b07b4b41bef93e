"""How fast NCCL moves one point-to-point message (send/recv), by the channels it runs it on.

NCCL cuts a send into parts over a number of channels that grows with the message
(``treeattn.cost.nccl_channels.p2p_channels``), and each channel moves about one link's
worth: a 32-64 MiB send between two H100s of an 8-rank communicator runs on 4 channels at
80-82 GB/s, 128 MiB on 8 at 162 GB/s, 256 MiB on 16 at 300 GB/s (results/published,
xxrjun-nccl-tests-cluster), far below the 370 GB/s of the GPU's NVLink. The simulator
(``treeattn.cost.simulate``) caps each GPU send's flow at that rate.

The channels depend on the communicator the send runs in. treeattn's executor gives every
pair of ranks that exchanges messages a communicator of its own (``exec.comm``): two
ranks, on one node or two (``PAIR``). nccl-tests runs one communicator of every rank
(``WORLD``), whose per-peer channels are the fewest any peer of a rank gets (NCCL takes
one figure per communicator, so across nodes the network's count holds for NVLink peers
too) and whose sends share the communicator's channels with every rank's peer.

From NCCL 2.19-2.30 (``src/graph/paths.cc`` ``ncclTopoGetNchannels`` and
``ncclTopoComputeP2pChannels``, ``src/init.cc`` ``computeBuffSizes``):

* channels per peer: a peer over NVLink 2 per NVLink of the path (NCCL's path bandwidth
  over its per-link figure: 36 through the NVSwitches of an H100), any other local peer 2,
  a peer across nodes one per local NIC or one per ``P2P_PER_CHANNEL_NET_BW`` = 14 GB/s of
  them; rounded up to a power of two;
* what a channel moves: NCCL's per-link NVLink figure (20.6 GB/s on Hopper; an 8-GPU H100
  node measures 20.0-20.5 per channel at 4-8 channels), its PCIe rating of the path, or 14
  GB/s over the network (the corpus measures 15.2 GB/s on one channel, 80 ranks on 10
  nodes, and 12.5 per channel on two, one GPU per node on 10 nodes);
* the chunk a part is cut by: 512 KiB (``P2P_NVL_CHUNKSIZE``) on one node whose GPUs all
  share NVLink, 128 KiB (``P2P_PCI_CHUNKSIZE``) on one node without, 128 KiB
  (``P2P_NET_CHUNKSIZE``) across nodes, twice that on Blackwell GPUs with Arm hosts.

Routes (``router``): in a communicator of every rank NCCL sends to another node through
the NIC on the peer's rail, over NVLink to the local GPU of the peer's index first (PXN,
``search.cc`` ``ncclTopoGetNetDev``), so a rail-optimized fabric's spines carry none of it;
on 10 H100 nodes (80 ranks, NCCL 2.29.2) the model comes within -2.3..-0.5 % of nccl-tests'
all-to-all of 128 MiB-16 GiB with PXN, +9..+12 % without (results/published). A
communicator per pair holds no such GPU: the sender's own NIC, as ``Topology.route``.

Not for AMD GPUs: RCCL's point-to-point channels are not modelled (an MI300X pair's one
xGMI link caps its sends anyway). Not where the ranks are host CPUs. On a topology whose link
rates were measured (``cost.link_rates: measured``), not on a send that crosses a link whose
rate calibration fitted (``Topology.fitted_links``): that rate has the channels in it, and the
cap would count them twice. A send over links no log fitted (which keep the rate a transfer
reached on them at datasheet rates) is capped as at datasheet rates, NCCL's figures read from
the hardware ratings the topology keeps (``Topology.rated``); one that keeps none is not capped.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from treeattn.cost import nccl_fabric, nccl_rates, nccl_tuning
from treeattn.cost.nccl_channels import P2P_NET_CHANNEL_GBPS, P2P_NVL_CHUNK, comm_channels, p2p_channels, pow2_up
from treeattn.errors import InputError
from treeattn.topology.model import DeviceKind, LinkClass, LinkKind, Topology
from treeattn.topology.nccl_version import NEWEST, OLDEST, Release, by_release, nccl_release

__all__ = ["PAIR", "WORLD", "PeerChannels", "applies", "grouped_call_channels", "peer_channels", "p2p_message_gbps",
           "router"]

PAIR = "pair"
"""Every pair of ranks that exchanges messages has a communicator of its own (treeattn's executor)."""
WORLD = "world"
"""One communicator of every rank (nccl-tests)."""

_PXN_C2C = ((OLDEST, False), ((2, 28, 3), True))
"""(first release, whether PXN may reach a NIC through the GPU's own CPU over NVLink-C2C)."""
_PCI_CHUNK = 1 << 17
_NET_CHUNK = 1 << 17
_GROUP_END_P2P = ((2, 8, 0), (2, 12, 0))
"""[first, end) of the releases whose ncclGroupEnd cuts a group's sends into channels itself
(group.cc, the ``delta`` loop of tags v2.8.4-1, v2.9.9-1, v2.10.3-1 and v2.11.4-1; 2.7 cuts them
otherwise, and 2.12's loop runs over nodes, shuffling a node's peers over the channels)."""
_OLD_MAXCHANNELS = 32
"""MAXCHANNELS (devcomm.h) and so NCCL_MAX_P2P_NCHANNELS' default in those releases."""
_OLD_P2P_STEP = (1 << 22) // 8
"""A point-to-point step there: DEFAULT_BUFFSIZE (init.cc, 4 MiB) over NCCL_STEPS (8); a part is
cut between one step and SENDRECV_SLICEFACTOR (4) of them (group.cc getP2pChunkSize)."""


@dataclass(frozen=True, slots=True)
class PeerChannels:
    """What decides the channels of a send from one rank to one peer, and their rate."""

    comm: int
    """The communicator's channels (``nccl_channels.comm_channels``)."""
    ranks: int
    nodes: int
    per_peer: int
    """Channels NCCL gives a peer in this communicator (before the power of two)."""
    per_channel_gbps: float
    chunk: int
    """NCCL's point-to-point chunk (bytes) in this communicator."""

    def channels(self, nbytes: int) -> int:
        return p2p_channels(self.comm, nbytes, self.ranks, self.nodes, self.per_peer, self.chunk)

    def gbps(self, nbytes: int) -> float:
        """The most a send of ``nbytes`` reaches: its channels times one channel's rate."""
        return self.channels(nbytes) * self.per_channel_gbps


def applies(topo: Topology) -> bool:
    """Whether NCCL's point-to-point channels cap sends on ``topo`` (module docstring): on a
    measured topology, the sends that cross no fitted link (``peer_channels`` leaves the others
    out)."""
    if topo.cost.link_rates == "measured":
        if topo.rated is topo or len(topo.fitted_links) == len(topo.links):
            return False
        topo = topo.rated
    if nccl_rates.p2p_link_gbps(topo) is None:
        return False
    if any(topo.rank_device(r).kind is not DeviceKind.GPU for r in range(topo.num_ranks)):
        return False
    return not any(ln.kind is LinkKind.XGMI for ln in topo.links)


def peer_channels(topo: Topology, pairs: Iterable[tuple[int, int]],
                  communicator: str = PAIR) -> dict[tuple[int, int], PeerChannels] | None:
    """Per (src, dst) rank pair, the figures of its sends (``PeerChannels``), or None where
    the cap does not apply (``applies``); a pair whose sends cross a fitted link
    (``Topology.fitted_links``) is left out. Kept with the topology's routes, so a topology
    simulated again and again derives each pair once.

    Args:
        topo: the topology.
        pairs: the (sender, receiver) rank pairs.
        communicator: ``PAIR`` (a communicator per pair, as treeattn runs plans) or ``WORLD``
            (one of every rank, as nccl-tests runs).
    """
    if communicator not in (PAIR, WORLD):
        raise InputError(f"communicator must be {PAIR!r} or {WORLD!r}, got {communicator!r}")
    view = _view(topo)
    if view is None:
        return None
    fitted = topo.fitted_links
    route = view.route if communicator == WORLD else topo.route
    return {(a, b): view.peer(a, b, communicator) for a, b in pairs if fitted.isdisjoint(route(a, b))}


def p2p_message_gbps(topo: Topology, src: int, dst: int, nbytes: int, communicator: str = PAIR) -> float:
    """The most one send of ``nbytes`` from rank ``src`` to ``dst`` reaches under NCCL
    (``math.inf`` where the cap does not apply)."""
    got = peer_channels(topo, [(src, dst)], communicator)
    hit = None if got is None else got.get((src, dst))
    return math.inf if hit is None else hit.gbps(nbytes)


def router(topo: Topology, communicator: str = PAIR) -> Callable[[int, int], tuple[int, ...]] | None:
    """The links a send crosses under NCCL, per (src, dst) rank pair, where NCCL's PXN routes
    it other than ``topo.route``; None where it never does.

    PXN (NCCL 2.12 on, ``NCCL_P2P_PXN_LEVEL=2`` by default; ``search.cc``
    ``ncclTopoGetNetDev``): a send to a rank of another node leaves through the NIC of the
    local GPU with the peer's device index, which it reaches over NVLink, so it stays on the
    peer's rail. NCCL finds that GPU among the communicator's ranks: in a communicator of
    every rank (``WORLD``, nccl-tests) it is there; in one per pair of ranks (``PAIR``,
    treeattn's executor) no other GPU of the sender's node is, and the send uses the sender's
    own NIC.
    """
    view = _view(topo) if communicator == WORLD else None
    return view.route if view is not None and view.pxn_possible() else None


def _view(topo: Topology) -> _View | None:
    """The topology's ``_View`` (of its hardware ratings where its rates were measured), made
    once and kept with its routes; None where NCCL's point-to-point model does not apply
    (``applies``)."""
    idx = topo._index
    if idx not in _VIEWS:
        _VIEWS[idx] = _View(topo.rated) if applies(topo) else None
    return _VIEWS[idx]


class _View:
    """The topology as NCCL's point-to-point code sees it, with what it derived so far."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.idx = topo._index
        self.arch = nccl_tuning.nccl_arch(topo.rank_device(0).model or "")
        self.grace = any("GRACE" in d.model.upper() for d in topo.devices if d.kind is DeviceKind.CPU)
        self.done: dict[tuple[str, int, int], PeerChannels] = {}
        self._path: dict[tuple[int, int], tuple[bool, float, float]] = {}
        self._world: tuple[int, int, int, dict[int, int]] | None = None
        self._pxn: dict[tuple[int, int], tuple[int, ...]] = {}
        version = topo.cost.nccl_version
        self.release = NEWEST if version is None else nccl_release(version)
        self._local: tuple[dict[int, list[str]], dict[str, int]] | None = None

    def peer(self, a: int, b: int, communicator: str) -> PeerChannels:
        key = (communicator, a, b)
        hit = self.done.get(key)
        if hit is None:
            hit = self.done[key] = self._world_peer(a, b) if communicator == WORLD else self._pair_peer(a, b)
        return hit

    def _pair_peer(self, a: int, b: int) -> PeerChannels:
        nodes = 1 if self.same_node(a, b) else 2
        nvlink, path, per_link = self.path(a, b)
        if nodes > 1:
            nic = min(self._nic_gbps(a), self._nic_gbps(b))
            gpu = self._fabric_total(a)
            comm = _comm(self.arch, 2, gpu, gpu, 1, nic)
        else:
            comm = _comm(self.arch, 1, path, (self._fabric_total(a) or path) if nvlink else path, 0, 0.0)
        chunk = self._chunk(nodes, nvlink)
        return PeerChannels(comm, 2, nodes, self.per_peer(a, b), self.per_channel(a, b), chunk)

    def _world_peer(self, a: int, b: int) -> PeerChannels:
        if self._world is None:
            fab = nccl_fabric.fabric(self.topo)
            p = self.topo.num_ranks
            nvlink = fab.nodes == 1 and all(self.path(0, c)[0] for c in range(1, p))
            self._world = (fab.channels or 1, fab.nodes, self._chunk(fab.nodes, nvlink), {})
        comm, nodes, chunk, least = self._world
        if a not in least:
            # paths.cc: one per-peer figure per communicator, the fewest any peer of the rank gets
            least[a] = min(self.per_peer(a, c) for c in range(self.topo.num_ranks) if c != a)
        return PeerChannels(comm, self.topo.num_ranks, nodes, least[a], self.per_channel(a, b), chunk)

    def pxn_possible(self) -> bool:
        nodes = {self.topo.rank_device(r).node for r in range(self.topo.num_ranks)}
        return len(nodes) > 1

    def route(self, a: int, b: int) -> tuple[int, ...]:
        """The links of a send from rank ``a`` to rank ``b`` in a communicator of every rank
        (``router``)."""
        hit = self._pxn.get((a, b))
        if hit is None:
            proxy = None if self.same_node(a, b) else self._proxy(a, b)
            topo = self.topo
            hit = topo.route(a, b) if proxy is None else topo.route(a, proxy) + topo.route(proxy, b)
            self._pxn[(a, b)] = hit
        return hit

    def _proxy(self, a: int, b: int) -> int | None:
        """The rank a send from ``a`` to ``b`` goes through under PXN, or None: the GPU of
        ``a``'s node with ``b``'s index on its node, when ``a`` reaches it over NVLink, its
        NIC hangs under it without a CPU between (NCCL: PATH_PXB at most; ``_pxn_reach``) and
        is not ``a``'s. NCCL takes the first local GPU of that NIC as the proxy, even where the
        NIC is ``a``'s own; the direct path kept here crosses the same network hop."""
        topo, idx = self.topo, self.idx
        if self._local is None:
            gpus: dict[int, list[str]] = {}
            for d in topo.devices:
                if d.kind is DeviceKind.GPU:
                    gpus.setdefault(d.node, []).append(d.name)
            ranks = {topo.ranks[r]: r for r in range(topo.num_ranks)}
            self._local = (gpus, ranks)
        gpus, ranks = self._local
        da, db = topo.rank_device(a), topo.rank_device(b)
        j = gpus[db.node].index(db.name)
        here = gpus.get(da.node, [])
        if j >= len(here) or here[j] == da.name or here[j] not in ranks:
            return None
        c = ranks[here[j]]
        if not self.path(a, c)[0]:
            return None
        got = idx.nic_path(topo.rank_device(c))
        if got is None or got[0] == idx.nic_of(da) or not self._pxn_reach(got[1]):
            return None
        return c

    def _pxn_reach(self, path: tuple[int, ...]) -> bool:
        """Whether a GPU's path to its NIC lets NCCL send through it (PXN): PCIe switches only
        (PATH_PXB), or from 2.28.3 also its own CPU over NVLink-C2C first (PATH_P2C,
        ``NCCL_PXN_C2C``, 0 before then and 1 from v2.28.3-1)."""
        links, by_name = self.topo.links, self.idx.by_name
        inner = [by_name[links[i].dst].kind for i in path[:-1]]
        if all(k is DeviceKind.PCIE_SWITCH for k in inner):
            return True
        return (by_release(_PXN_C2C, self.release) and links[path[0]].kind is LinkKind.C2C
                and all(k is DeviceKind.PCIE_SWITCH for k in inner[1:]))

    def _out(self, r: int) -> list:
        links = self.topo.links
        return [links[i] for i in self.idx.out[self.topo.ranks[r]]]

    def same_node(self, a: int, b: int) -> bool:
        """One NCCL node: one machine, or one NVLink domain spanning machines."""
        da, db = self.topo.rank_device(a), self.topo.rank_device(b)
        if da.node == db.node:
            return True
        ia = self.idx.island(da.name)
        return ia >= 0 and ia == self.idx.island(db.name)

    def path(self, a: int, b: int) -> tuple[bool, float, float]:
        """(whether a reaches b over NVLink inside a node, NCCL's bandwidth of that path, its
        per-link figure); off NVLink the NCCL-rated PCIe bottleneck of the route, twice."""
        key = (a, b)
        hit = self._path.get(key)
        if hit is not None:
            return hit
        topo, arch = self.topo, self.arch
        route = [topo.links[i] for i in topo.route(a, b)]
        if self.same_node(a, b) and all(ln.cls is LinkClass.GPU_FABRIC for ln in route):
            fab = [ln for ln in self._out(a) if ln.cls is LinkClass.GPU_FABRIC]
            per_link = min(nccl_rates.nccl_link_bw_gbps(ln, arch) / max(ln.count, 1) for ln in fab)
            direct = [ln for ln in fab if ln.dst == topo.ranks[b]]
            if any(topo.device(ln.dst).kind is DeviceKind.NVSWITCH for ln in fab):
                bw = sum(nccl_rates.nccl_link_bw_gbps(ln, arch) for ln in fab)
            elif direct:
                bw = sum(nccl_rates.nccl_link_bw_gbps(ln, arch) for ln in direct)
            else:
                bw = min(nccl_rates.nccl_link_bw_gbps(ln, arch) for ln in route)
            hit = (True, bw, per_link)
        else:
            rated = [nccl_rates.nccl_link_bw_gbps(ln, arch) for ln in route if ln.cls is LinkClass.PCIE]
            bw = min(rated) if rated else min((ln.bw_gbps for ln in route), default=math.inf)
            hit = (False, bw, bw)
        self._path[key] = hit
        return hit

    def _nic_gbps(self, a: int) -> float:
        nic = self.idx.nic_of(self.topo.rank_device(a))
        if nic is None:
            return 0.0
        links = self.topo.links
        return nccl_rates.nic_bw(links[i] for i in self.idx.out[nic])

    def per_peer(self, a: int, b: int) -> int:
        """ncclTopoGetNchannels: the channels NCCL gives peer b of rank a."""
        if not self.same_node(a, b):
            return max(1, math.ceil(self._nic_gbps(a) / P2P_NET_CHANNEL_GBPS))
        nvlink, bw, per_link = self.path(a, b)
        return 2 * max(1, int(bw / per_link + 1e-9)) if nvlink else 2

    def per_channel(self, a: int, b: int) -> float:
        if not self.same_node(a, b):
            return P2P_NET_CHANNEL_GBPS
        return self.path(a, b)[2]

    def _chunk(self, nodes: int, nvlink: bool) -> int:
        if nodes > 1:
            return _NET_CHUNK * (2 if self.arch == "blackwell" and self.grace else 1)
        return P2P_NVL_CHUNK if nvlink else _PCI_CHUNK

    def _fabric_total(self, a: int) -> float:
        return nccl_rates.fabric_bw(self._out(a), self.arch)


_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per topology (its route index, which lives as long as it does), its _View (None: no cap)."""


@functools.lru_cache(maxsize=256)
def _comm(arch: str, nodes: int, path: float, gpu: float, nics: int, nic: float) -> int:
    return comm_channels(arch, nodes, path, gpu, nics, nic)[0]


def grouped_call_channels(topo: Topology, collective: str, nbytes: int, release: Release | None) -> int | None:
    """The channels a rank's kernel runs nccl-tests' ``sendrecv`` or ``alltoall`` of ``nbytes``
    (its size) on under NCCL 2.8-2.11 (``_GROUP_END_P2P``), one communicator of every rank of
    ``topo``; None under any other release (or none given).

    Those releases' ncclGroupEnd (group.cc) gives the sends to and receives from the peer at
    ``delta`` (rank + delta, rank - delta) parts of ``getP2pChunkSize`` bytes, part ``c`` on
    channel ``(delta + p2pChannels[c % p2pnChannelsPerPeer]) % p2pnChannels`` (paths.cc
    ncclTopoComputeP2pChannels: p2pnChannels the communicator's channels up to MAXCHANNELS,
    p2pnChannelsPerPeer the fewest ncclTopoGetNchannels gives a peer, both rounded up to a power
    of two; p2pChannels the channel indices bit-mirrored), and enqueue.cc setupLaunch launches
    every channel up to the highest with work, writing a no-op work on the empty ones below it.
    An all-to-all of 8 ranks up to 4 MiB (512 KiB a peer, one part) runs on channels 0-7.
    """
    lo, hi = _GROUP_END_P2P
    if release is None or not lo <= release < hi or collective not in ("sendrecv", "alltoall"):
        return None
    view = _view(topo)
    if view is None:
        return None
    n = topo.num_ranks
    comm = min(nccl_fabric.fabric(view.topo).channels or 1, _OLD_MAXCHANNELS)
    # ncclTopoGetNchannels: 2 a NVLink of the path to a local peer, 2 to another local one, 1
    # to one across nodes; the fewest over every pair.
    fewest = min((view.per_peer(a, b) if view.same_node(a, b) else 1)
                 for a in range(n) for b in range(n) if a != b)
    per_peer = pow2_up(min(comm, fewest))
    channels = pow2_up(comm)
    n_min = n_max = per_peer
    while n_min * n > channels and n_min > 1:
        n_min //= 2
    while n_max * n > channels * 4 and n_max > 1:
        n_max //= 2
    peer_bytes, deltas = (nbytes, (1,)) if collective == "sendrecv" else (nbytes // n, tuple(range(n)))
    size = max(_OLD_P2P_STEP, -(-peer_bytes // n_min))
    k = n_min
    while size > 4 * _OLD_P2P_STEP and k <= n_max // 2:
        k *= 2
        size = -(-peer_bytes // k)
    size = -(-size // _OLD_P2P_STEP) * _OLD_P2P_STEP
    parts = max(1, -(-peer_bytes // size))
    mirror = [_mirror(c, channels) for c in range(per_peer)]
    return 1 + max((d + mirror[c % per_peer]) % channels for d in deltas for c in range(parts))


def _mirror(c: int, channels: int) -> int:
    """paths.cc ncclTopoComputeP2pChannels: ``c``'s bits mirrored in ``channels`` (a power of two)."""
    out, b, mb = 0, 1, channels >> 1
    while b < channels:
        if c & b:
            out |= mb
        b, mb = b << 1, mb >> 1
    return out
