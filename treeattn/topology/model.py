"""Devices, links and the Topology they form.

Words we use: a *device* is a vertex (GPU, CPU socket, switch, NIC, host); a *link* is a
directed edge ``src -> dst`` (a full-duplex cable is two links); a *rank* is a process
placed on a GPU or host device; a *route* is the tuple of link indices a message from one
rank to another crosses, in order. ``bw_gbps`` is GB/s per direction for the whole link
(all ``count`` bonded lanes together); ``latency_us`` is the link's one-way latency.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from treeattn.errors import InputError, TopologyError
from treeattn.topology.nccl_version import NEWEST, nccl_release

__all__ = [
    "P2P_LEVELS",
    "P2P_LEVEL_ALIASES",
    "p2p_level_name",
    "p2p_level_names",
    "CALIBRATED_BY",
    "MAX_RANKS",
    "MAX_DEVICES",
    "MAX_LINKS",
    "check_rank_count",
    "check_device_count",
    "check_link_count",
    "DeviceKind",
    "LinkKind",
    "LinkClass",
    "Device",
    "Link",
    "CostParams",
    "HostParams",
    "Topology",
    "link_class",
]


CALIBRATED_BY = "treeattn calibrate"
"""How a fitted topology's ``sources`` entry begins (``Topology.calibrated``)."""

MAX_RANKS = 16_384
"""The most ranks a topology may place (``dgx-h100:nodes=2048``): the largest size the
search, simulator and plan files are measured at (``benchmarks/``); beyond it a topology
is refused before it is built (README, "Scale")."""

MAX_DEVICES = 1_000_000
MAX_LINKS = 1_000_000
"""The most devices and directed links a topology may hold. The families at ``MAX_RANKS``
make up to about 64,000 devices (``dgx-a100:nodes=2048,nics_per_leaf=1``) and 283,000
links (``mi300x:nodes=2048``); a compact file or family that asks for more
(``pcie.switches: 1000000000``) is refused before anything is built, which would take
minutes and gigabytes first (README, "Scale")."""


def _check_limit(count: int, limit: int, noun: str, what: str) -> None:
    if count > limit:
        raise TopologyError(f"{what}: {count:,} {noun}, above treeattn's limit of {limit:,} {noun} "
                            "(README, 'Scale')")


def check_rank_count(ranks: int, what: str) -> None:
    """Refuse ``ranks`` above ``MAX_RANKS``; ``what`` names what makes them (a topology, a
    flag, a rank pattern), e.g. ``"100,000 nodes of 8 GPUs"``."""
    _check_limit(ranks, MAX_RANKS, "ranks", what)


def check_device_count(devices: int, what: str) -> None:
    """Refuse ``devices`` above ``MAX_DEVICES`` (``what`` as for ``check_rank_count``)."""
    _check_limit(devices, MAX_DEVICES, "devices", what)


def check_link_count(links: int, what: str) -> None:
    """Refuse ``links`` (directed) above ``MAX_LINKS`` (``what`` as for ``check_rank_count``)."""
    _check_limit(links, MAX_LINKS, "links", what)


class DeviceKind(StrEnum):
    """Vertices. ``cpu`` is a socket and its PCIe root complex; ``switch`` a network switch
    (its ``tier`` says leaf/spine/core); ``host`` a whole machine used as one endpoint
    (CPU-only runs: ranks on a host talk over loopback or its network links)."""

    GPU = "gpu"
    CPU = "cpu"
    PCIE_SWITCH = "pcie-switch"
    NVSWITCH = "nvswitch"
    NIC = "nic"
    SWITCH = "switch"
    HOST = "host"


class LinkKind(StrEnum):
    """Edge kinds. ``upi`` and ``infinity-fabric`` are CPU socket interconnects; ``c2c`` is a
    GPU's coherent link to its own CPU (NVLink-C2C on Grace superchips), routed like PCIe."""

    NVLINK = "nvlink"
    XGMI = "xgmi"
    PCIE = "pcie"
    C2C = "c2c"
    UPI = "upi"
    INFINITY_FABRIC = "infinity-fabric"
    INFINIBAND = "infiniband"
    ROCE = "roce"
    ETHERNET = "ethernet"
    LOOPBACK = "loopback"


class LinkClass(StrEnum):
    """What routing does with a link kind."""

    GPU_FABRIC = "gpu-fabric"  # nvlink, xgmi: GPU<->GPU or GPU<->NVSwitch
    PCIE = "pcie"  # pcie and socket interconnects inside one node
    NETWORK = "network"  # infiniband, roce, ethernet: between nodes
    LOOPBACK = "loopback"


_CLASS = {
    LinkKind.NVLINK: LinkClass.GPU_FABRIC,
    LinkKind.XGMI: LinkClass.GPU_FABRIC,
    LinkKind.PCIE: LinkClass.PCIE,
    LinkKind.C2C: LinkClass.PCIE,
    LinkKind.UPI: LinkClass.PCIE,
    LinkKind.INFINITY_FABRIC: LinkClass.PCIE,
    LinkKind.INFINIBAND: LinkClass.NETWORK,
    LinkKind.ROCE: LinkClass.NETWORK,
    LinkKind.ETHERNET: LinkClass.NETWORK,
    LinkKind.LOOPBACK: LinkClass.LOOPBACK,
}


def link_class(kind: LinkKind) -> LinkClass:
    return _CLASS[kind]


@dataclass(frozen=True, slots=True)
class Device:
    """A vertex of the topology."""

    name: str
    """Unique name, e.g. ``n0.gpu3``."""
    kind: DeviceKind
    node: int = 0
    """Index of the machine it sits in; devices shared by machines (network switches, the
    NVSwitch of a multi-node NVLink domain) use -1."""
    model: str = ""
    """Product name (GPUs, NICs, CPUs), e.g. ``H100-SXM5-80GB``."""
    mem_bw_gbps: float = 0.0
    """Memory bandwidth (GPUs and hosts: what the compute model reads KV at)."""
    mem_gb: float = 0.0
    """Memory size in GB (GPUs, hosts)."""
    p2p: bool = True
    """GPU peer-to-peer over PCIe; False (RTX 4090) makes copies bounce through host memory."""
    tier: str = ""
    """Network switches: ``leaf``, ``spine`` or ``core``."""
    nic: str = ""
    """GPUs and hosts: the NIC that carries this device's cross-node traffic (nearest when empty)."""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise TopologyError(f"device name must be a non-empty string, got {self.name!r}")
        try:
            if type(self.kind) is not DeviceKind:  # builders pass members: skip the lookup
                object.__setattr__(self, "kind", DeviceKind(self.kind))
        except ValueError:
            kinds = ", ".join(k.value for k in DeviceKind)
            raise TopologyError(
                f"device {self.name!r}: unknown kind {self.kind!r}; choose one of {kinds}"
            ) from None
        if self.mem_bw_gbps < 0 or self.mem_gb < 0:
            raise TopologyError(f"device {self.name!r}: memory figures must be >= 0")
        if self.kind is DeviceKind.GPU and self.mem_bw_gbps <= 0:
            raise TopologyError(f"device {self.name!r}: a GPU needs mem_bw_gbps > 0")

    def to_dict(self) -> dict:
        out: dict = {"name": self.name, "kind": self.kind.value, "node": self.node}
        for key in ("model", "mem_bw_gbps", "mem_gb", "tier", "nic"):
            value = getattr(self, key)
            if value:
                out[key] = value
        if not self.p2p:
            out["p2p"] = False
        return out


RATING_UNMEASURED = ("a rating (rated_gbps, rated_latency_us) keeps the hardware's figure beside a measured one, "
                     "and fitted marks a measured rate; this topology's rates are not measured (cost.link_rates)")


@dataclass(frozen=True, slots=True)
class Link:
    """A directed edge ``src -> dst``."""

    src: str
    dst: str
    kind: LinkKind
    bw_gbps: float
    """GB/s in this direction, all bonded lanes together."""
    latency_us: float = 0.0
    """One-way latency of this hop."""
    count: int = 1
    """Bonded links/lanes making up this edge (e.g. 18 NVLinks)."""
    generation: int | None = None
    """NVLink or PCIe generation."""
    width: int | None = None
    """PCIe lanes (x16 -> 16)."""
    flow_gbps: float | None = None
    """The most one flow gets on this link, below ``bw_gbps`` (which all flows share): TCP
    over loopback moves one connection at one core's copy rate, while several connections
    together use more cores. None: one flow may take the whole link."""
    rated_gbps: float | None = None
    """The hardware's rate where ``bw_gbps`` holds a measured one (``treeattn calibrate``
    keeps it): NCCL's collective model rates links from the hardware (``Topology.rated``)."""
    rated_latency_us: float | None = None
    """Likewise the latency ``latency_us`` had before calibration replaced it."""
    fitted: bool = False
    """Whether calibration fitted ``bw_gbps`` to whole measured messages (NCCL's channels
    included), where other links of a measured topology keep the rate a transfer reached on
    them at datasheet rates (``Topology.fitted_links``)."""

    def __post_init__(self) -> None:
        try:
            if type(self.kind) is not LinkKind:  # builders pass members: skip the lookup
                object.__setattr__(self, "kind", LinkKind(self.kind))
        except ValueError:
            kinds = ", ".join(k.value for k in LinkKind)
            raise TopologyError(
                f"link {self.src}->{self.dst}: unknown kind {self.kind!r}; choose one of {kinds}"
            ) from None
        if not (isinstance(self.bw_gbps, (int, float)) and self.bw_gbps > 0):
            raise TopologyError(
                f"link {self.src}->{self.dst}: bw_gbps must be > 0, got {self.bw_gbps!r}"
            )
        if not (isinstance(self.latency_us, (int, float)) and self.latency_us >= 0):
            raise TopologyError(
                f"link {self.src}->{self.dst}: latency_us must be >= 0, got {self.latency_us!r}"
            )
        if not isinstance(self.count, int) or self.count < 1:
            raise TopologyError(f"link {self.src}->{self.dst}: count must be >= 1, got {self.count!r}")
        if self.flow_gbps is not None and not (isinstance(self.flow_gbps, (int, float)) and self.flow_gbps > 0):
            raise TopologyError(
                f"link {self.src}->{self.dst}: flow_gbps must be > 0, got {self.flow_gbps!r}"
            )
        if self.rated_gbps is not None and not (isinstance(self.rated_gbps, (int, float)) and self.rated_gbps > 0):
            raise TopologyError(
                f"link {self.src}->{self.dst}: rated_gbps must be > 0, got {self.rated_gbps!r}"
            )
        if self.rated_latency_us is not None and not (
            isinstance(self.rated_latency_us, (int, float)) and self.rated_latency_us >= 0
        ):
            raise TopologyError(
                f"link {self.src}->{self.dst}: rated_latency_us must be >= 0, got {self.rated_latency_us!r}"
            )
        if not isinstance(self.fitted, bool):
            raise TopologyError(f"link {self.src}->{self.dst}: fitted must be true or false, got {self.fitted!r}")
        if self.src == self.dst and self.kind is not LinkKind.LOOPBACK:
            raise TopologyError(f"link {self.src}->{self.dst}: only a loopback link may be a self-loop")

    @property
    def has_rating(self) -> bool:
        """Whether it keeps a hardware figure beside a measured one (``rated_gbps``,
        ``rated_latency_us``) or is marked ``fitted``, which a topology allows with
        ``cost.link_rates: measured`` only."""
        return self.rated_gbps is not None or self.rated_latency_us is not None or self.fitted

    @property
    def cls(self) -> LinkClass:
        """What routing does with this link's kind."""
        return _CLASS[self.kind]

    def to_dict(self) -> dict:
        out: dict = {
            "src": self.src,
            "dst": self.dst,
            "kind": self.kind.value,
            "bw_gbps": self.bw_gbps,
            "latency_us": self.latency_us,
        }
        if self.count != 1:
            out["count"] = self.count
        if self.generation is not None:
            out["generation"] = self.generation
        if self.width is not None:
            out["width"] = self.width
        for key in ("flow_gbps", "rated_gbps", "rated_latency_us"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.fitted:
            out["fitted"] = True
        return out

    @property
    def flow_cap_gbps(self) -> float:
        """The most one flow crossing this link alone gets."""
        return self.bw_gbps if self.flow_gbps is None else min(self.flow_gbps, self.bw_gbps)


@dataclass(frozen=True, slots=True)
class HostParams:
    """How ranks on host CPUs cost time (``treeattn.cost.host``); calibration fits them on
    CPU ranks. GPU ranks never read them."""

    host_cores: int = 0
    """CPU cores the ranks placed on ``host`` devices share (per node, or per machine, see
    ``cpu_scope``). 0: not modelled, every host rank runs on a core of its own. When set,
    the CPU work of host ranks (``cpu_us`` per message end, merges, compute) shares them."""
    cpu_us: float = 0.0
    """CPU time a message costs a host rank at each end (posting and sending it; waking up
    for it and receiving it), on the message's path; only with ``host_cores`` set."""
    cpu_scope: str = "node"
    """Which host ranks share ``host_cores``: those of one ``node``, or all of the
    ``machine`` (an emulated cluster: every namespace runs on the one host's cores)."""
    cpu_queue: str = "fair"
    """How host ranks' CPU work shares the cores: ``fair`` (all at once, like the kernel's
    default scheduler) or ``fifo`` (at most ``host_cores`` at once, each run to its end in
    the order it became ready: ranks under SCHED_RR/SCHED_FIFO, as ``validate --realtime``)."""
    coll_cpu_us: float | None = None
    """CPU time a message end costs inside a library collective on host ranks (gloo's own
    threads, not the interpreter); None: ``cpu_us``."""
    step_us: float = 0.0
    """CPU time a host rank spends on each step of transfers before its messages go out
    (building and posting the step's operations, then collecting them): the interpreter's
    own work, on the path; only with ``host_cores`` set."""
    wakeup_us: float = 0.0
    """Time before a rank runs its first op when a step begins (waking a blocked process);
    calibration measures it on hosts, where it is tens to hundreds of microseconds."""
    start_cpu_us: float = 0.0
    """CPU time every host rank spends when a run begins, before its first step (returning
    from the wait that started it, the interpreter's setup): the ranks queue for the cores
    at once; only with ``host_cores`` set."""
    cpu_us_per_kb: float = 0.0
    """CPU time a message costs each end per KiB it carries (the network stack copying it
    as it goes and arrives); nothing waits for it, but it loads the cores; only with
    ``host_cores`` set."""

    def __post_init__(self) -> None:
        if not isinstance(self.host_cores, int) or self.host_cores < 0:
            raise TopologyError(f"cost.host_cores must be a whole number >= 0, got {self.host_cores!r}")
        if min(self.cpu_us, self.wakeup_us, self.step_us, self.coll_cpu_us or 0.0, self.start_cpu_us,
               self.cpu_us_per_kb) < 0:
            raise TopologyError("cost.cpu_us, cost.coll_cpu_us, cost.step_us, cost.wakeup_us, cost.start_cpu_us "
                                "and cost.cpu_us_per_kb must be >= 0")
        if self.cpu_queue not in ("fair", "fifo"):
            raise TopologyError(f"cost.cpu_queue must be 'fair' or 'fifo', got {self.cpu_queue!r}")
        if self.cpu_scope not in ("node", "machine"):
            raise TopologyError(f"cost.cpu_scope must be 'node' or 'machine', got {self.cpu_scope!r}")


_HOST_FIELDS = frozenset(f.name for f in dataclasses.fields(HostParams))
"""Keys of the YAML ``cost:`` mapping that belong to ``HostParams``."""


P2P_LEVELS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
"""NCCL's path types, nearest first (``src/graph/topo.h`` PATH_LOC .. PATH_SYS, the names
``NCCL_P2P_LEVEL`` takes): LOC the same device (as a level: no peer-to-peer at all, what
``NCCL_P2P_DISABLE=1`` sets), NVL one NVLink hop, NVB NVLink through another GPU, PIX through
at most one PCIe switch, PXB through several, PHB through a CPU's host bridge (nvidia-smi's
NODE too), SYS across CPU sockets; C2C, P2C and PXN (Grace and NIC paths) are accepted as
levels. The values of ``CostParams.p2p_level`` (``treeattn.cost.nccl_rates.p2p_level``)."""

P2P_LEVEL_ALIASES = {"XGMI": "NVL"}
"""Other names of ``P2P_LEVELS`` that ``NCCL_P2P_LEVEL`` takes: RCCL names path type 1 ``XGMI``
where NCCL says ``NVL`` (``src/graph/topo.cc`` ``topoPathTypeStr``). ``p2p_level_name`` reads them."""


def p2p_level_name(text: str) -> str | None:
    """The level of ``P2P_LEVELS`` a name stands for, as NCCL and RCCL read ``NCCL_P2P_LEVEL``
    (in capitals): one of ``P2P_LEVELS``, or an alias of one (``P2P_LEVEL_ALIASES``: XGMI is
    NVL); None for any other text. The one place that knows the names: ``cost.p2p_level``
    (``CostParams``, the YAML schema) and the environment (``treeattn.cost.nccl_env``) read
    them through it."""
    if not isinstance(text, str):
        return None
    if text in P2P_LEVELS:
        return text
    return P2P_LEVEL_ALIASES.get(text)


def p2p_level_names() -> str:
    """The names ``p2p_level_name`` reads, for messages: ``LOC, NVL, ..., SYS (XGMI for NVL)``."""
    aliases = ", ".join(f"{a} for {b}" for a, b in P2P_LEVEL_ALIASES.items())
    return f"{', '.join(P2P_LEVELS)} ({aliases})"


@dataclass(frozen=True, slots=True)
class CostParams:
    """Per-machine constants of the cost model that calibration replaces: the devices' and
    links' (here) and, for ranks on host CPUs, ``host`` (``HostParams``). The YAML ``cost:``
    mapping holds both, flat (``from_flat``, ``to_dict``)."""

    overhead_us: float = 2.0
    """Software overhead a sender pays per message (launch, protocol); on GPU ranks, per peer
    group a rank posts in a step, receiving as well as sending (``treeattn.cost.simulate``). Host ranks with
    ``host.host_cores`` set pay CPU work instead (``treeattn.cost.host``)."""
    launch_us: float = 5.0
    """Fixed cost of a local compute step (kernel launch)."""
    mem_efficiency: float = 0.8
    """Fraction of memory bandwidth a memory-bound kernel reaches."""
    attn_launch_us: float | None = None
    """Fixed cost of the COMPUTE kernel (partial attention) when it differs from
    ``launch_us`` (which merges and copies pay): on a CPU several library calls; on a GPU
    the launch, a split-KV kernel's combining kernel and the pipeline's fill (the families
    set the fit to published decode kernels, docs/attention-model.md)."""
    attn_gbps: float | None = None
    """Effective bandwidth of the COMPUTE kernel over the bytes it moves, when measured
    (calibration); None: the device's ``mem_bw_gbps`` x ``mem_efficiency``."""
    attn_next_launch_us: float | None = None
    """Fixed cost of a rank's later COMPUTE ops in one run (ring attention computes once per
    KV block): the kernel warm, as timed back to back alone, where ``attn_launch_us`` is the
    first one's as a run begins with every rank at work; None: ``attn_launch_us``."""
    link_rates: str = "datasheet"
    """What the links' ``bw_gbps`` are: ``datasheet`` figures, of which GPUs' transfers reach
    what NCCL rates them (``treeattn.cost.nccl_rates.p2p_link_gbps``), or ``measured`` rates
    (``treeattn calibrate`` fitted them) that transfers reach as they are."""
    attn_efficiency: float | None = None
    """Share of its device's memory bandwidth the COMPUTE kernel (partial attention over a KV
    block) reaches, where it differs from ``mem_efficiency`` (merges and copies keep that):
    published decode-attention kernels read KV at 0.56-0.80 of peak beside a fixed cost of
    7-14 us (docs/attention-model.md); None:
    ``mem_efficiency``. A measured ``attn_gbps`` takes precedence."""
    nccl_version: str | None = None
    """The NCCL release the cluster runs (``2.26.2``, or a bound such as ``<2.28``:
    ``treeattn.topology.nccl_version``), for the NCCL model's release-dependent figures (NVLS
    latencies and NCCL's NVLS estimate, docs/nccl-model.md); None: the newest it follows."""
    shm_gbps: float | None = None
    """What NCCL's shared-memory transport moves between two GPUs of a node without
    peer-to-peer (GeForce), GB/s of bus bandwidth, on this machine: the host sets it
    (``treeattn calibrate --from-nccl-tests`` fits it from a log of such GPUs, or write it);
    None: ``treeattn.cost.nccl_rates.SHM_GBPS``."""
    p2p_level: str | None = None
    """The farthest path (``P2P_LEVELS``) over which NCCL connects GPUs peer-to-peer, as
    ``NCCL_P2P_LEVEL`` sets it (``LOC``: ``NCCL_P2P_DISABLE=1``); None: NCCL's default
    (``treeattn.cost.nccl_rates.p2p_level``: PXB, SYS on AMD hosts of at most two GPUs). GPUs
    further apart talk through host memory."""
    host: HostParams = HostParams()
    """How ranks on host CPUs cost time."""

    def __post_init__(self) -> None:
        if self.shm_gbps is not None and not self.shm_gbps > 0:
            raise TopologyError(f"cost.shm_gbps must be > 0, got {self.shm_gbps}")
        if self.overhead_us < 0 or self.launch_us < 0:
            raise TopologyError("cost.overhead_us and cost.launch_us must be >= 0")
        if not 0 < self.mem_efficiency <= 1:
            raise TopologyError(f"cost.mem_efficiency must be in (0, 1], got {self.mem_efficiency}")
        if (self.attn_launch_us is not None and self.attn_launch_us < 0) or (
                self.attn_gbps is not None and self.attn_gbps <= 0) or (
                self.attn_next_launch_us is not None and self.attn_next_launch_us < 0):
            raise TopologyError("cost.attn_launch_us and cost.attn_next_launch_us must be >= 0 and cost.attn_gbps > 0")
        if self.attn_efficiency is not None and not 0 < self.attn_efficiency <= 1:
            raise TopologyError(f"cost.attn_efficiency must be in (0, 1], got {self.attn_efficiency}")
        if self.link_rates not in ("datasheet", "measured"):
            raise TopologyError(f"cost.link_rates must be 'datasheet' or 'measured', got {self.link_rates!r}")
        if self.p2p_level is not None:
            level = p2p_level_name(self.p2p_level)
            if level is None:
                raise TopologyError(f"cost.p2p_level must be one of {p2p_level_names()}, got {self.p2p_level!r}")
            object.__setattr__(self, "p2p_level", level)  # XGMI kept as NVL: one key, one YAML
        if self.nccl_version is not None:
            try:
                nccl_release(self.nccl_version)
            except InputError as exc:
                raise TopologyError(f"cost.nccl_version: {exc}") from None

    @classmethod
    def from_flat(cls, **terms: Any) -> CostParams:
        """The cost of a YAML ``cost:`` mapping (host terms and device terms side by side)."""
        host = {k: terms.pop(k) for k in list(terms) if k in _HOST_FIELDS}
        return cls(**terms, host=HostParams(**host))

    def with_host(self, **terms: Any) -> CostParams:
        """A copy with these ``HostParams`` terms replaced."""
        return dataclasses.replace(self, host=dataclasses.replace(self.host, **terms))

    def updated(self, **terms: Any) -> CostParams:
        """A copy with these terms replaced, named as in YAML (host and device side by side)."""
        host = {k: terms.pop(k) for k in list(terms) if k in _HOST_FIELDS}
        return dataclasses.replace(self, **terms).with_host(**host)

    def to_dict(self) -> dict:
        """The YAML ``cost:`` mapping; the host CPU terms only when they are set."""
        h = self.host
        out: dict = {"overhead_us": self.overhead_us, "launch_us": self.launch_us,
                     "mem_efficiency": self.mem_efficiency}
        if h.host_cores:
            out.update(host_cores=h.host_cores, cpu_us=h.cpu_us, cpu_scope=h.cpu_scope)
            if h.step_us:
                out["step_us"] = h.step_us
            if h.cpu_queue != "fair":
                out["cpu_queue"] = h.cpu_queue
            if h.coll_cpu_us is not None:
                out["coll_cpu_us"] = h.coll_cpu_us
            for key in ("start_cpu_us", "cpu_us_per_kb"):
                if getattr(h, key):
                    out[key] = getattr(h, key)
        if h.wakeup_us:
            out["wakeup_us"] = h.wakeup_us
        for key in ("attn_launch_us", "attn_gbps", "attn_next_launch_us", "attn_efficiency"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.link_rates != "datasheet":
            out["link_rates"] = self.link_rates
        if self.nccl_version is not None:
            out["nccl_version"] = self.nccl_version
        if self.shm_gbps is not None:
            out["shm_gbps"] = self.shm_gbps
        if self.p2p_level is not None:
            out["p2p_level"] = self.p2p_level
        return out

    def key(self) -> tuple:
        """What of it determines costs (for fingerprints)."""
        terms = self._terms()
        if self.link_rates != "datasheet":
            terms = (*terms, "rates", self.link_rates)
        if self.shm_gbps is not None:
            terms = (*terms, "shm", float(self.shm_gbps))
        if self.p2p_level is not None:
            terms = (*terms, "p2p_level", self.p2p_level)
        if self.nccl_version is None:
            return terms
        # keyed by the release the model takes: texts naming the same one cost the same
        release = nccl_release(self.nccl_version)
        return terms if release == NEWEST else (*terms, "nccl", release)

    def _terms(self) -> tuple:
        h = self.host
        base = (float(self.overhead_us), float(self.launch_us), float(self.mem_efficiency))
        if (not h.host_cores and not h.wakeup_us and self.attn_launch_us is None and self.attn_gbps is None
                and self.attn_next_launch_us is None):
            # fingerprints of topologies without the newer terms stay as they were
            return base if self.attn_efficiency is None else (*base, "attn_eff", float(self.attn_efficiency))
        terms = (*base, h.host_cores, float(h.cpu_us), h.cpu_scope, float(h.wakeup_us),
                 self.attn_launch_us, self.attn_gbps)
        if h.step_us or h.cpu_queue != "fair" or h.coll_cpu_us is not None:
            terms = (*terms, float(h.step_us), h.cpu_queue, h.coll_cpu_us)
        if h.start_cpu_us or h.cpu_us_per_kb:
            terms = (*terms, float(h.start_cpu_us), float(h.cpu_us_per_kb))
        if self.attn_next_launch_us is not None:
            terms = (*terms, "next", float(self.attn_next_launch_us))
        return terms if self.attn_efficiency is None else (*terms, "attn_eff", float(self.attn_efficiency))


@dataclass(frozen=True)
class Topology:
    """Devices, directed links and rank placement, with routing between ranks.

    Build one from YAML with ``treeattn.topology.load`` or from a family builder; the
    constructor checks names, endpoints and placement. ``check_routable()`` (run by the
    loaders) proves every rank reaches rank 0 and back.
    """

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    ranks: tuple[str, ...]
    """Device name of each rank, in rank order."""
    description: str = ""
    sources: tuple[str, ...] = ()
    """Citations for the figures used (docs/hardware.md rows, public specs)."""
    cost: CostParams = field(default_factory=CostParams)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "links", tuple(self.links))
        object.__setattr__(self, "ranks", tuple(self.ranks))
        object.__setattr__(self, "sources", tuple(self.sources))
        check_device_count(len(self.devices), f"topology {self.name!r}")
        check_link_count(len(self.links), f"topology {self.name!r}")
        seen: set[str] = set()
        for d in self.devices:
            if d.name in seen:
                raise TopologyError(f"topology {self.name!r}: duplicate device name {d.name!r}")
            seen.add(d.name)
        pairs: set[tuple[str, str]] = set()
        for i, ln in enumerate(self.links):
            for end in (ln.src, ln.dst):
                if end not in seen:
                    raise TopologyError(
                        f"topology {self.name!r}: links[{i}] names device {end!r}, which does not exist"
                    )
            if (ln.src, ln.dst) in pairs:
                raise TopologyError(
                    f"topology {self.name!r}: links[{i}] repeats {ln.src}->{ln.dst}; "
                    "bond parallel links with count instead"
                )
            pairs.add((ln.src, ln.dst))
            if ln.has_rating and self.cost.link_rates != "measured":
                raise TopologyError(f"topology {self.name!r}: links[{i}] ({ln.src}->{ln.dst}): {RATING_UNMEASURED}")
        if not self.ranks:
            raise TopologyError(f"topology {self.name!r}: no ranks placed")
        check_rank_count(len(self.ranks), f"topology {self.name!r}")
        by_name = {d.name: d for d in self.devices}
        used: set[str] = set()
        for r, dev in enumerate(self.ranks):
            if dev not in by_name:
                raise TopologyError(f"topology {self.name!r}: ranks[{r}] names unknown device {dev!r}")
            kind = by_name[dev].kind
            if kind not in (DeviceKind.GPU, DeviceKind.HOST):
                raise TopologyError(
                    f"topology {self.name!r}: ranks[{r}] is placed on {dev!r}, a {kind.value}; "
                    "ranks go on gpu or host devices"
                )
            if kind is DeviceKind.GPU and dev in used:
                raise TopologyError(f"topology {self.name!r}: ranks[{r}] puts a second rank on GPU {dev!r}")
            used.add(dev)

    # -- lookups -------------------------------------------------------------------------

    @cached_property
    def _index(self):  # noqa: ANN202 - internal, built once
        from treeattn.topology.routing import RouteIndex

        return RouteIndex(self)

    def device(self, name: str) -> Device:
        try:
            return self._index.by_name[name]
        except KeyError:
            raise TopologyError(f"topology {self.name!r} has no device {name!r}") from None

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    @cached_property
    def on_hosts(self) -> bool:
        """Whether any rank sits on a ``host`` device (then collectives run on gloo, not NCCL,
        at the measured rates: nothing reads the links' ratings)."""
        return any(self.rank_device(r).kind is DeviceKind.HOST for r in range(self.num_ranks))

    @cached_property
    def floor_overhead_us(self) -> float:
        """The least fixed cost any message pays before its bytes move, for lower bounds:
        ``cost.overhead_us``, or 0 when host ranks' messages cost CPU work instead
        (``cost.host.host_cores`` set), which may overlap other messages' work."""
        if self.cost.host.host_cores > 0 and self.on_hosts:
            return 0.0
        return self.cost.overhead_us

    def rank_device(self, rank: int) -> Device:
        return self.device(self.ranks[rank])

    @cached_property
    def node_ranks(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each node, nodes in the order of their numbers."""
        by_node: dict[int, list[int]] = {}
        for r in range(self.num_ranks):
            by_node.setdefault(self.rank_device(r).node, []).append(r)
        return tuple(tuple(by_node[n]) for n in sorted(by_node))

    def fabric_island(self, name: str) -> int:
        """The NVLink/xGMI island of device ``name``: an id shared by the devices that
        GPU-fabric links join, directly or through NVSwitches; -1 for a device without such
        links (each alone)."""
        self.device(name)  # an unknown name is an error, not an island of its own
        return self._index.island(name)

    def link_index(self, src: str, dst: str) -> int:
        """Index in ``links`` of the link ``src -> dst``."""
        try:
            return self._index.link_id[(src, dst)]
        except KeyError:
            raise TopologyError(f"topology {self.name!r} has no link {src}->{dst}") from None

    # -- routing -------------------------------------------------------------------------

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Link indices a message from rank ``src`` to rank ``dst`` crosses, in order.

        Routing follows docs/design.md section 4: NVLink/xGMI (directly or through NVSwitches)
        inside a node, else PCIe through the lowest common bridge (through host memory for
        GPUs without peer-to-peer), across sockets when needed; between nodes through each
        end's NIC and the switch fabric (ECMP spread over equal-length switch paths).
        """
        self._check_rank(src)
        self._check_rank(dst)
        if src == dst:
            return ()
        return self._index.device_route(self.ranks[src], self.ranks[dst])

    def device_route(self, src: str, dst: str) -> tuple[int, ...]:
        """Link indices from device ``src`` to device ``dst`` (by name), routed as ``route``
        routes ranks' messages: a GPU's path to a NIC other than its own."""
        self.device(src)
        self.device(dst)
        return () if src == dst else self._index.device_route(src, dst)

    def route_links(self, src: int, dst: int) -> list[Link]:
        return [self.links[i] for i in self.route(src, dst)]

    def route_latency_us(self, src: int, dst: int) -> float:
        """Sum of hop latencies from rank ``src`` to rank ``dst``."""
        return sum(self.links[i].latency_us for i in self.route(src, dst))

    def route_bw_gbps(self, src: int, dst: int) -> float:
        """Bottleneck bandwidth of the route (infinite for a rank to itself)."""
        r = self.route(src, dst)
        return min((self.links[i].bw_gbps for i in r), default=float("inf"))

    def shared_links(self, route_a: tuple[int, ...], route_b: tuple[int, ...]) -> tuple[int, ...]:
        """Link indices two routes both cross (where their flows contend)."""
        b = set(route_b)
        return tuple(i for i in route_a if i in b)

    def check_routable(self) -> None:
        """Raise ``TopologyError`` unless every rank reaches rank 0 and rank 0 reaches it, and
        every two ranks on different machines reach each other over the network."""
        def pairs() -> Iterator[tuple[int, int]]:
            for r in range(1, self.num_ranks):
                yield 0, r
                yield r, 0
            gap = self._index.network_gap() if self.num_ranks > 2 else None  # after rank 0's: their error first
            if gap is not None:
                yield gap

        for a, b in pairs():
            try:
                self.route(a, b)
            except TopologyError as exc:
                raise TopologyError(
                    f"rank {a} ({self.ranks[a]}) cannot reach rank {b} ({self.ranks[b]}): {exc}"
                ) from None

    def _check_rank(self, r: int) -> None:
        if not 0 <= r < self.num_ranks:
            raise TopologyError(f"rank {r} out of range: topology {self.name!r} has {self.num_ranks} ranks")

    # -- identity ------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The explicit form (every device and link), as plain data."""
        return {
            "name": self.name,
            "description": self.description,
            "sources": list(self.sources),
            "cost": self.cost.to_dict(),
            "devices": [d.to_dict() for d in self.devices],
            "links": [ln.to_dict() for ln in self.links],
            "ranks": list(self.ranks),
        }

    @cached_property
    def rated(self) -> Topology:
        """This topology with each link's hardware rating (``Link.rated_gbps``,
        ``rated_latency_us``) where calibration measured it, and ``cost.link_rates`` back to
        datasheet; itself where nothing was measured so. A calibrated link rate is fitted to
        treeattn's own transfers; NCCL's collective model reads a link as NCCL rates the
        hardware and runs its trees, NVLS and protocols on it, so it reads this instead."""
        if not any(ln.rated_gbps is not None or ln.rated_latency_us is not None for ln in self.links):
            return self
        links = tuple(
            dataclasses.replace(
                ln,
                bw_gbps=ln.bw_gbps if ln.rated_gbps is None else ln.rated_gbps,
                latency_us=ln.latency_us if ln.rated_latency_us is None else ln.rated_latency_us,
                rated_gbps=None,
                rated_latency_us=None,
                fitted=False,
            )
            for ln in self.links
        )
        return dataclasses.replace(self, links=links, cost=dataclasses.replace(self.cost, link_rates="datasheet"))

    @cached_property
    def fitted_links(self) -> frozenset[int]:
        """The links whose rate calibration fitted to whole measured messages (``Link.fitted``);
        on a measured topology that marks none (written before the mark), all of them. The
        other links of a measured topology hold the rate a transfer reached on them at datasheet
        rates, which NCCL's per-channel cap on a send still bounds (``cost.nccl_p2p``)."""
        if self.cost.link_rates != "measured":
            return frozenset()
        marked = frozenset(i for i, ln in enumerate(self.links) if ln.fitted)
        return marked or frozenset(range(len(self.links)))

    @property
    def calibrated(self) -> bool:
        """Whether ``treeattn calibrate`` fitted its figures (rather than datasheet or built-in defaults)."""
        return any(s.startswith(CALIBRATED_BY) for s in self.sources)

    @property
    def on_gpus(self) -> bool:
        """Whether its ranks are GPUs (not processes on CPUs)."""
        return any(self.rank_device(r).kind is DeviceKind.GPU for r in range(self.num_ranks))

    @cached_property
    def fingerprint(self) -> str:
        """Hash of what determines costs (devices, links, ranks, cost constants), not names
        of the file or its description, nor the order devices and links are listed in
        (routing does not depend on it): two files describing the same machine match."""
        # Plain tuples (numbers as floats, so 25 and 25.0 agree) hash several times faster
        # than JSON at 200,000 links.
        devices = sorted(
            (d.name, d.kind.value, d.node, d.model, float(d.mem_bw_gbps), float(d.mem_gb), d.p2p, d.tier, d.nic)
            for d in self.devices
        )
        links = sorted(
            (ln.src, ln.dst, ln.kind.value, float(ln.bw_gbps), float(ln.latency_us), ln.count, ln.generation, ln.width)
            + (() if ln.flow_gbps is None else (float(ln.flow_gbps),))
            + (() if ln.rated_gbps is None and ln.rated_latency_us is None
               else ("rated", ln.rated_gbps, ln.rated_latency_us))
            + (("fitted",) if ln.fitted else ())
            for ln in self.links
        )
        cost = self.cost.key()
        blob = repr((devices, links, self.ranks, cost)).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()[:16]
