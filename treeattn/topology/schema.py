"""The topology file formats, as pydantic models (used at the file boundary only).

Three forms of one file, told apart by their keys:

* explicit (``devices:``): every device and directed link, and the rank placement;
* compact (``node:``): a node template times ``nodes``, plus network fabric parameters,
  built by ``treeattn.topology.compact``;
* family (``family:``): a parametric builder of ``treeattn.topology.families`` by name.

Units as everywhere: ``_gbps`` GB/s per direction (400 Gb/s = 50 GB/s), ``_us`` microseconds.
Every model forbids unknown fields, so a typo is an error that names the field.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from treeattn.errors import InputError, TopologyError
from treeattn.topology.model import P2P_LEVEL_ALIASES, P2P_LEVELS, DeviceKind, LinkKind
from treeattn.topology.nccl_version import nccl_release, version_text

__all__ = [
    "FieldError",
    "check_name",
    "PCIE_WIDTHS",
    "CostSpec",
    "DeviceSpec",
    "LinkSpec",
    "ExplicitFile",
    "HostLinkSpec",
    "GpuSpec",
    "SocketLinkSpec",
    "CpuSpec",
    "PcieSpec",
    "FabricKind",
    "FabricSpec",
    "NicSpec",
    "NodeSpec",
    "NetworkTopology",
    "NetworkSpec",
    "CompactFile",
    "FamilyFile",
]

Loc = tuple[str | int, ...]



def _not_bool(value: Any) -> Any:
    # Lax parsing reads true/false as 1/0; PyYAML (YAML 1.1) reads 1e3 as text, which it keeps.
    if isinstance(value, bool):
        raise ValueError(f"input should be a number, not {str(value).lower()}")
    return value


ONE_LINE = "must be one line of printable characters (no tab, newline or invisible character)"


def _printable(value: str) -> str:
    # A name goes into one-line messages, plan files and file names: a newline in it split them.
    if not value.isprintable():
        raise ValueError(f"{ONE_LINE}, got {value!r}")
    return value


def check_name(value: str, what: str) -> str:
    """``value`` as a name (``what``, e.g. ``--name``, for the message): one line of printable
    characters, as a topology file's names must be; InputError otherwise."""
    if not value or not value.isprintable():
        raise InputError(f"{what}: {ONE_LINE}, got {value!r}")
    return value


Printable = Annotated[str, AfterValidator(_printable)]
Name = Annotated[str, Field(min_length=1), AfterValidator(_printable)]
Float = Annotated[float, BeforeValidator(_not_bool)]
Int = Annotated[int, BeforeValidator(_not_bool)]

PCIE_WIDTHS = (1, 2, 4, 8, 12, 16, 32)
"""The lane counts a PCIe link is built with (the PCIe base specification's x1 to x32)."""


def _pcie_width(value: int) -> int:
    # NCCL rates a PCIe link by width x per-lane speed: a width no link has (17, a typo of 16)
    # rated it 6 % fast without a word.
    if value not in PCIE_WIDTHS:
        raise ValueError(f"must be a PCIe link width, {', '.join(map(str, PCIE_WIDTHS[:-1]))} or {PCIE_WIDTHS[-1]} "
                         f"lanes (got {value})")
    return value


Width = Annotated[int, BeforeValidator(_not_bool), AfterValidator(_pcie_width)]


class FieldError(TopologyError):
    """A semantic error at a field path (``("links", 3, "dst")``); the loader adds the
    file name and line."""

    def __init__(self, loc: Loc, message: str) -> None:
        self.loc = tuple(loc)
        self.message = message
        super().__init__(f"{format_loc(self.loc)}: {message}" if self.loc else message)


def format_loc(loc: Loc) -> str:
    """``("links", 3, "bw_gbps")`` -> ``links[3].bw_gbps``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_P2P_NAMES = (*P2P_LEVELS, *P2P_LEVEL_ALIASES)
"""What ``cost.p2p_level`` takes: the names ``NCCL_P2P_LEVEL`` takes (``model.p2p_level_name``;
``CostParams`` keeps an alias as its level)."""


class CostSpec(_Spec):
    """Per-machine constants of the cost model (``treeattn calibrate`` replaces them)."""

    overhead_us: Float = Field(2.0, ge=0, description="Software overhead a sender pays per message "
                               "(on GPUs: per peer group, both sides).")
    launch_us: Float = Field(5.0, ge=0, description="Fixed cost of a local compute step (kernel launch).")
    mem_efficiency: Float = Field(
        0.8, gt=0, le=1, description="Fraction of memory bandwidth a memory-bound kernel reaches."
    )
    host_cores: Int = Field(0, ge=0, description="CPU cores the host ranks share (0: not modelled).")
    cpu_us: Float = Field(0.0, ge=0, description="CPU time a message costs a host rank at each end.")
    cpu_scope: Literal["node", "machine"] = Field(
        "node", description="Host ranks sharing host_cores: those of one node, or all (an emulated cluster)."
    )
    cpu_queue: Literal["fair", "fifo"] = Field(
        "fair", description="Host CPU sharing: fair (all at once) or fifo (real-time ranks: one at a time per core)."
    )
    coll_cpu_us: Float | None = Field(
        None, ge=0, description="CPU time a message end costs inside a library collective (default cpu_us)."
    )
    step_us: Float = Field(0.0, ge=0, description="CPU time a host rank spends per step of transfers.")
    wakeup_us: Float = Field(0.0, ge=0, description="Delay before a rank's first op (waking a blocked process).")
    start_cpu_us: Float = Field(0.0, ge=0, description="CPU time every host rank spends as a run begins.")
    cpu_us_per_kb: Float = Field(0.0, ge=0, description="CPU time a message costs each end per KiB it carries.")
    attn_launch_us: Float | None = Field(None, ge=0, description="Fixed cost of the attention kernel (COMPUTE).")
    attn_gbps: Float | None = Field(None, gt=0, description="Effective GB/s of the attention kernel (COMPUTE).")
    attn_efficiency: Float | None = Field(
        None, gt=0, le=1, description="Share of a device's memory bandwidth the attention kernel reaches (COMPUTE; "
        "default mem_efficiency; attn_gbps, when set, wins)."
    )
    attn_next_launch_us: Float | None = Field(
        None, ge=0, description="Fixed cost of a rank's later COMPUTE ops in one run (default attn_launch_us)."
    )
    nccl_version: str | None = Field(
        None, description="The NCCL release the cluster runs (2.26.2, 2.26, or a bound: <2.28, <=2.27.3), for the NCCL "
        "model's release-dependent NVLS figures; default: the newest release the model follows."
    )
    shm_gbps: Float | None = Field(
        None, gt=0, description="GB/s of bus bandwidth NCCL's shared-memory transport moves between GPUs without "
        "peer-to-peer on this host (default: treeattn.cost.nccl_rates.SHM_GBPS)."
    )
    p2p_level: Literal[_P2P_NAMES] | None = Field(
        None, description="The farthest path over which NCCL connects GPUs peer-to-peer, as NCCL_P2P_LEVEL sets it "
        "(LOC none, as NCCL_P2P_DISABLE=1; NVL one NVLink hop, XGMI as RCCL names it; PIX one PCIe switch, PXB "
        "several, PHB through a CPU, "
        "SYS across sockets); default NCCL's: PXB, SYS on AMD hosts of at most 2 GPUs. GPUs further apart talk "
        "through host memory (shm_gbps)."
    )
    link_rates: Literal["datasheet", "measured"] = Field(
        "datasheet", description="datasheet: link bw_gbps are datasheet figures, of which GPU transfers reach NCCL's "
        "rating; measured: fitted rates (treeattn calibrate), reached as they are."
    )

    @field_validator("nccl_version", mode="before")
    @classmethod
    def _release(cls, value: object) -> object:
        if value is None:
            return value
        try:
            nccl_release(version_text(value))
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return value


# -- explicit form ---------------------------------------------------------------------------


class DeviceSpec(_Spec):
    """One device of the explicit form."""

    name: Name = Field(description="Unique name, e.g. n0.gpu3.")
    kind: DeviceKind
    node: Int = Field(0, ge=-1, description="Machine index; -1 for devices shared by machines.")
    model: Printable = ""
    mem_bw_gbps: Float = Field(0.0, ge=0, description="Memory bandwidth, GB/s (required > 0 for GPUs).")
    mem_gb: Float = Field(0.0, ge=0)
    p2p: bool = Field(True, description="GPU peer-to-peer over PCIe; false bounces copies through host memory.")
    tier: Literal["", "leaf", "spine", "core"] = ""
    nic: str = Field("", description="NIC carrying this device's cross-node traffic (nearest when empty).")


class LinkSpec(_Spec):
    """One directed link of the explicit form; ``duplex: true`` also makes ``dst -> src``."""

    src: str = Field(min_length=1)
    dst: str = Field(min_length=1)
    kind: LinkKind
    bw_gbps: Float = Field(gt=0, description="GB/s per direction, all bonded lanes together.")
    latency_us: Float = Field(0.0, ge=0)
    count: Int = Field(1, ge=1, description="Bonded links/lanes making up this edge.")
    generation: Int | None = Field(None, ge=1)
    width: Width | None = None
    flow_gbps: Float | None = Field(None, gt=0, description="The most one flow gets (loopback TCP: one core's rate).")
    rated_gbps: Float | None = Field(
        None, gt=0, description="The hardware's rate where bw_gbps was measured (calibrate keeps it for NCCL's model)."
    )
    rated_latency_us: Float | None = Field(
        None, ge=0, description="The latency latency_us had before calibration measured it."
    )
    fitted: bool = Field(
        False, description="Calibration fitted bw_gbps to whole measured messages (NCCL's channels included)."
    )
    duplex: bool = False


class ExplicitFile(_Spec):
    """Explicit form: every device and link. ``ranks`` lists device names in rank order;
    an entry may hold ranges (``n0.gpu{0..7}``) or a repeat (``host0*4``); omitted, every
    GPU in device order (or every host when there are no GPUs) gets one rank."""

    name: Name
    description: str = ""
    sources: list[str] = []
    cost: CostSpec = CostSpec()
    devices: list[DeviceSpec] = Field(min_length=1)
    links: list[LinkSpec] = []
    ranks: list[str] | None = None


# -- compact form ------------------------------------------------------------------------------


class HostLinkSpec(_Spec):
    """How each GPU attaches to its PCIe switch or socket, when not plain PCIe (``c2c``)."""

    # Only the kinds routed as a GPU's host attachment; an NVLink here left the GPU with no
    # PCIe path to its NIC, refused later as an unroutable rank without naming this field.
    kind: Literal[LinkKind.PCIE, LinkKind.C2C] = LinkKind.PCIE
    bw_gbps: Float = Field(gt=0)
    latency_us: Float = Field(0.0, ge=0)
    generation: Int | None = Field(None, ge=1)
    width: Width | None = None


class GpuSpec(_Spec):
    """The GPUs of one node."""

    count: Int = Field(ge=1)
    model: Printable = ""
    mem_bw_gbps: Float = Field(gt=0)
    mem_gb: Float = Field(0.0, ge=0)
    p2p: bool = True
    host_link: HostLinkSpec | None = None


class SocketLinkSpec(_Spec):
    """The link between two CPU sockets of a node (every pair gets one, both directions)."""

    kind: Literal[LinkKind.UPI, LinkKind.INFINITY_FABRIC] = LinkKind.UPI
    bw_gbps: Float = Field(gt=0)
    latency_us: Float = Field(0.0, ge=0)


class CpuSpec(_Spec):
    """CPU sockets of one node (each with its PCIe root complex). Without ``link`` the
    sockets are not joined: their devices then talk over the GPU fabric or the network."""

    count: Int = Field(1, ge=1)
    model: Printable = ""
    link: SocketLinkSpec | None = None


class PcieSpec(_Spec):
    """The node's PCIe tree. ``switches`` are spread evenly over the sockets and the GPUs
    evenly over the switches (over the sockets when there are none); NIC k sits beside
    the first GPU it serves. Every PCIe link gets ``bw_gbps``."""

    generation: Int | None = Field(None, ge=1)
    width: Width | None = 16
    bw_gbps: Float = Field(gt=0)
    latency_us: Float = Field(0.0, ge=0)
    switches: Int = Field(0, ge=0)


class FabricKind(StrEnum):
    """GPU-to-GPU fabric of a node: ``nvswitch`` (every GPU to one logical switch),
    ``full-mesh`` (one link per GPU pair, e.g. xGMI), ``pairs`` (listed pairs, e.g. the
    DGX-1 hybrid cube-mesh), ``none`` (PCIe only)."""

    NONE = "none"
    NVSWITCH = "nvswitch"
    FULL_MESH = "full-mesh"
    PAIRS = "pairs"


class FabricSpec(_Spec):
    """``bw_gbps`` is per GPU per direction for ``nvswitch``, per GPU pair for
    ``full-mesh``, per bonded lane for ``pairs`` (a pair with 2 lanes gets twice it)."""

    kind: FabricKind = FabricKind.NONE
    # A GPU fabric is NVLink or xGMI: a pcie or network kind here built a topology that routed
    # as something else (GPUs into an "nvswitch" over PCIe) without a word.
    link: Literal[LinkKind.NVLINK, LinkKind.XGMI] | None = Field(
        None, description="Link kind; default xgmi for full-mesh, else nvlink."
    )
    bw_gbps: Float | None = Field(None, gt=0)
    count: Int = Field(1, ge=1, description="Bonded links per GPU (nvswitch) or per pair (full-mesh).")
    generation: Int | None = Field(None, ge=1)
    latency_us: Float = Field(0.0, ge=0)
    pairs: list[tuple[Int, Int, Int]] | None = Field(None, description="pairs only: [gpu_a, gpu_b, lanes].")
    nodes_per_domain: Int = Field(
        1, ge=1, description="nvswitch only: consecutive nodes sharing one NVLink domain (GB200 NVL72: 18)."
    )


class NicSpec(_Spec):
    """Network adapters of one node. ``gpus[k]`` lists the GPUs NIC k serves; by default
    GPU g is served by NIC g*count//gpus (rail-optimized GPU k <-> NIC k when equal)."""

    count: Int = Field(ge=1)
    model: Printable = ""
    bw_gbps: Float = Field(gt=0, description="Port speed, GB/s per direction (400 Gb/s = 50).")
    gpus: list[list[Int]] | None = None


class NodeSpec(_Spec):
    """Template of one machine."""

    gpus: GpuSpec
    cpus: CpuSpec = CpuSpec()
    pcie: PcieSpec
    fabric: FabricSpec = FabricSpec()
    nics: NicSpec | None = None


class NetworkTopology(StrEnum):
    """``rail-optimized``: NIC k of every node goes to the leaves of rail k; ``fat-tree``:
    NICs fill leaves in node order. Spines join every leaf in both."""

    RAIL_OPTIMIZED = "rail-optimized"
    FAT_TREE = "fat-tree"


class NetworkSpec(_Spec):
    """Two-tier switch fabric between nodes. Leaves are built alike: each one's uplink
    bandwidth is the fullest leaf's downlink total (its NICs' bandwidth) divided by
    ``oversubscription``, split evenly over the spines."""

    kind: Literal[LinkKind.INFINIBAND, LinkKind.ROCE, LinkKind.ETHERNET] = LinkKind.INFINIBAND
    topology: NetworkTopology = NetworkTopology.FAT_TREE
    nics_per_leaf: Int = Field(32, ge=1)
    spines: Int | None = Field(
        None, ge=0,
        description="Default: none for one leaf, else the fullest leaf's NICs / oversubscription, rounded up.",
    )
    oversubscription: Float = Field(1.0, ge=1)
    switch_latency_us: Float = Field(0.6, ge=0, description="Latency of each network link (one switch hop).")


class CompactFile(_Spec):
    """Compact form: ``nodes`` copies of ``node`` joined by ``network``. Ranks are every
    GPU, node by node."""

    name: Name
    description: str = ""
    sources: list[str] = []
    cost: CostSpec = CostSpec()
    nodes: Int = Field(1, ge=1)
    node: NodeSpec
    network: NetworkSpec | None = None


class FamilyFile(_Spec):
    """A named parametric family (``treeattn topo list`` shows them) with parameters."""

    family: str = Field(min_length=1)
    params: dict[str, int | float | str | bool] = {}
    name: Name | None = None  # as the other forms: "" named the topology nothing
    description: str | None = None
    sources: list[str] = Field([], description="Added to the family's own citations.")
    cost: CostSpec | None = None
