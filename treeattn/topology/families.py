"""Parametric topology families: a name -> builder registry, addressed as ``NAME:key=value,...``.

Each builder fills a compact-form spec (``treeattn.topology.schema.CompactFile``) and
builds it with ``treeattn.topology.compact``, so a family and a compact YAML file with the
same figures give the same topology (same fingerprint). Every figure cites its source: a
row of docs/hardware.md ("HW: <row>") or a public spec. Latencies are
per link and split NCCL's per-hop latencies (HW: "Its latency model": NVLink 0.6 us,
PCIe 1 us per GPU-to-GPU hop, LL protocol) over the links of such a hop; they are rough
defaults that ``treeattn calibrate`` replaces.

Examples:
    >>> from treeattn.topology.families import build_family
    >>> build_family("dgx-h100", {"nodes": 2}).num_ranks
    16
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from treeattn.errors import TopologyError
from treeattn.topology.attention_fits import ATTN_AMPERE, ATTN_BLACKWELL, ATTN_HOPPER
from treeattn.topology.compact import build_compact
from treeattn.topology.model import CostParams, Device, DeviceKind, Link, LinkKind, Topology, check_rank_count
from treeattn.topology.schema import (
    CompactFile,
    CostSpec,
    CpuSpec,
    FabricKind,
    FabricSpec,
    FamilyFile,
    FieldError,
    GpuSpec,
    HostLinkSpec,
    Loc,
    NetworkSpec,
    NetworkTopology,
    NicSpec,
    NodeSpec,
    PcieSpec,
    SocketLinkSpec,
    format_loc,
)

__all__ = ["Param", "Family", "FAMILIES", "parse_family_spec", "build_family", "build_family_file",
           "this_machine_cores"]


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a family."""

    name: str
    default: Any
    parse: Callable[[Any], Any]
    """Turns a value (text from a spec string, or YAML scalar) into the builder's value;
    raises ValueError with the reason when it is not acceptable."""
    doc: str


@dataclass(frozen=True, slots=True)
class Family:
    """A parametric builder registered under ``name``."""

    name: str
    description: str
    params: tuple[Param, ...]
    build: Callable[..., Topology]
    """Called with every parameter (defaults filled in) as keyword arguments."""
    fields: Mapping[Loc, str] = dataclasses.field(default_factory=dict)
    """Compact-form field -> the parameter that sets it, so that an error the builder
    raises on that field (a size above the limits) names the parameter."""


def _int(lo: int) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise ValueError(f"must be an integer >= {lo}")
        # int() reads '2_0' as 20 and ' 4' as 4: a spec's value is digits only
        if isinstance(v, str) and not (v.isascii() and v.lstrip("-").isdigit()):
            raise ValueError(f"must be an integer >= {lo}")
        try:
            n = int(v)
        except ValueError:
            raise ValueError(f"must be an integer >= {lo}") from None
        if n < lo:
            raise ValueError(f"must be an integer >= {lo}")
        return n

    return parse


def _choice(*options: Any) -> Callable[[Any], Any]:
    def parse(v: Any) -> Any:
        for o in options:
            if str(v) == str(o):
                return o
        raise ValueError(f"must be one of {', '.join(str(o) for o in options)}")

    return parse


def _ratio(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError("must be a finite number >= 1") from None
    # inf passes ">= 1", and the network spec built from it then refused it with a traceback.
    if isinstance(v, bool) or not x >= 1 or math.isinf(x):
        raise ValueError("must be a finite number >= 1")
    return x


def _spines(v: Any) -> int | None:
    if str(v) == "auto":
        return None
    try:
        return _int(0)(v)
    except ValueError:
        raise ValueError("must be auto or an integer >= 0") from None


def _network_fields(nodes_name: str = "nodes") -> dict[Loc, str]:
    return {("nodes",): nodes_name, ("network", "spines"): "spines", ("network", "nics_per_leaf"): "nics_per_leaf",
            ("network", "oversubscription"): "oversubscription", ("network", "topology"): "fabric"}


_GPUS_FIELDS: dict[Loc, str] = {("node", "gpus", "count"): "gpus", ("node", "pcie", "switches"): "gpus",
                                ("node", "nics", "count"): "gpus"}


def _network_params(nodes_name: str = "nodes", fabric: str = "rail-optimized") -> tuple[Param, ...]:
    return (
        Param(nodes_name, 1, _int(1), f"how many {nodes_name}"),
        Param("fabric", fabric, _choice("rail-optimized", "fat-tree"), "network layout between nodes"),
        Param("nics_per_leaf", 32, _int(1), "NICs per leaf switch"),
        Param("spines", "auto", _spines, "spine switches (auto: fullest leaf's NICs / oversubscription)"),
        Param("oversubscription", 1.0, _ratio, "leaf downlink / uplink bandwidth"),
    )


# -- figures shared by builders ----------------------------------------------------------------

# PCIe per link: half of NCCL's 1 us PCIe hop (GPU -> switch -> GPU is two links).
_PCIE_LAT = 0.5
# NVLink per link through an NVSwitch: half of NCCL's 0.6 us NVLink hop.
_NVSWITCH_LAT = 0.3
# A direct GPU-GPU link is one whole hop.
_DIRECT_LAT = 0.6
# Socket interconnect: no published latency at hand; assumed one PCIe-hop-like step.
_SOCKET_LAT = 0.5
# Network: HW "InfiniBand HDR / NDR / XDR port" row, switch hop 0.5-0.6 us; one per link.
_SWITCH_LAT = 0.6
# PCIe 5.0 x16: HW "PCIe 5.0 x16" row, 63 GB/s nominal, ~55 measured host-to-device.
_PCIE5 = PcieSpec(generation=5, width=16, bw_gbps=55.0, latency_us=_PCIE_LAT)
# PCIe 4.0 x16: HW "PCIe 4.0 x16" row, 31.5 GB/s nominal, ~25 usable.
_PCIE4 = PcieSpec(generation=4, width=16, bw_gbps=25.0, latency_us=_PCIE_LAT)


def _network(kind: LinkKind, p: Mapping[str, Any]) -> NetworkSpec:
    return NetworkSpec(
        kind=kind, topology=NetworkTopology(p["fabric"]), nics_per_leaf=p["nics_per_leaf"],
        spines=p["spines"], oversubscription=p["oversubscription"], switch_latency_us=_SWITCH_LAT,
    )




def _nvidia_hgx(
    name: str, description: str, sources: list[str], gpus: GpuSpec, fabric: FabricSpec, cpus: CpuSpec,
    pcie: PcieSpec, nics: NicSpec, p: Mapping[str, Any], cost: CostSpec | None = None,
) -> Topology:
    nodes = p["nodes"]
    spec = CompactFile(
        name=name, description=description, sources=sources, nodes=nodes,
        node=NodeSpec(gpus=gpus, cpus=cpus, pcie=pcie, fabric=fabric, nics=nics),
        network=_network(LinkKind.INFINIBAND, p) if nodes > 1 else None, cost=cost or CostSpec(),
    )
    return build_compact(spec)


_SRC_NCCL_LAT = "docs/hardware.md 'How NCCL models the same thing': per-hop latency NVLink 0.6 us, PCIe 1 us (LL)"
_SRC_SWITCH = "docs/hardware.md 'InfiniBand HDR / NDR / XDR port' row: switch hop ~0.5-0.6 us"
_SRC_PCIE5 = "docs/hardware.md 'PCIe 5.0 x16' row: 63 GB/s nominal, ~55 GB/s measured host-to-device (used)"
_SRC_PCIE4 = "docs/hardware.md 'PCIe 4.0 x16' row: ~31.5 GB/s nominal, ~25 usable (used)"
_SRC_NDV5 = (
    "Azure/azhpc-images topology/ndv5-topo.xml (HGX H100, fixture nccl-topo.azure-ndv5-h100.xml): "
    "one PCIe Gen5 x16 bridge per GPU/NIC pair, 4 per socket"
)
_SRC_RAIL = "docs/hardware.md 'InfiniBand' row: DGX H100 8 x 400 Gb/s ConnectX-7, one per GPU, rail-optimized"
_SRC_LEAF = "NVIDIA DGX SuperPOD reference architecture: 32 nodes per scalable unit, QM9700 leaves (64 NDR ports)"


def _hopper(p: Mapping[str, Any], name: str, gpu: GpuSpec, description: str, sources: list[str]) -> Topology:
    return _nvidia_hgx(
        name, description,
        sources + [
            "docs/hardware.md 'NVLink 4 (H100/H200)' row: 18 links x 25 GB/s = 450 GB/s per GPU per direction",
            _SRC_PCIE5, _SRC_NDV5, _SRC_RAIL,
            "docs/hardware.md 'CPU socket link' row: Sapphire Rapids ~22 GB/s (NCCL SRP_QPI_BW)",
            _SRC_NCCL_LAT, _SRC_SWITCH, _SRC_LEAF,
        ],
        gpus=gpu,
        # One logical NVSwitch stands for the 4 NVSwitch chips (HW: NVLink 4 row).
        fabric=FabricSpec(kind=FabricKind.NVSWITCH, bw_gbps=450.0, count=18, generation=4, latency_us=_NVSWITCH_LAT),
        # 2 x Xeon Platinum 8480C (Sapphire Rapids), UPI ~22 GB/s (HW: CPU socket link row).
        cpus=CpuSpec(count=2, model="Xeon-Platinum-8480C",
                     link=SocketLinkSpec(kind=LinkKind.UPI, bw_gbps=22.0, latency_us=_SOCKET_LAT)),
        # One Gen5 switch per GPU/NIC pair, 4 per socket (Azure NDv5 topology file).
        pcie=_PCIE5.model_copy(update={"switches": 8}),
        # 8 x ConnectX-7 400 Gb/s = 50 GB/s, GPU k <-> NIC k (HW: InfiniBand row).
        nics=NicSpec(count=8, model="ConnectX-7-NDR", bw_gbps=50.0),
        p=p, cost=ATTN_HOPPER,
    )


def _dgx_h100(name: str, p: Mapping[str, Any]) -> Topology:
    # H100 SXM5 80 GB, 3.35 TB/s (HW: GPU memory bandwidth line; DGX H100 datasheet: 640 GB total).
    gpu = GpuSpec(count=8, model="H100-SXM5-80GB", mem_bw_gbps=3350.0, mem_gb=80.0)
    return _hopper(p, name, gpu, f"NVIDIA DGX H100 x {p['nodes']}: 8 H100 SXM5 per node on NVSwitch (NVLink 4), "
                   f"8 x 400 Gb/s NDR InfiniBand per node ({p['fabric']})",
                   ["docs/hardware.md GPU memory bandwidth: H100 SXM 3.35 TB/s",
                    "NVIDIA DGX H100 datasheet: 8x H100 80GB, 2x Xeon Platinum 8480C, 8x ConnectX-7 400Gb/s"])


def _hgx_h200(name: str, p: Mapping[str, Any]) -> Topology:
    # H200 141 GB HBM3e, 4.8 TB/s (HW: GPU memory bandwidth line; NVIDIA H200 datasheet).
    gpu = GpuSpec(count=8, model="H200-SXM-141GB", mem_bw_gbps=4800.0, mem_gb=141.0)
    return _hopper(p, name, gpu, f"NVIDIA HGX/DGX H200 x {p['nodes']}: 8 H200 per node on NVSwitch (NVLink 4), "
                   f"8 x 400 Gb/s NDR InfiniBand per node ({p['fabric']}); DGX H200 is this baseboard in "
                   "NVIDIA's chassis",
                   ["docs/hardware.md GPU memory bandwidth: H200 4.8 TB/s",
                    "NVIDIA H200 datasheet: 141 GB HBM3e; DGX H200 datasheet: 8x ConnectX-7 400Gb/s, "
                    "2x Xeon Platinum 8480C"])


def _dgx_a100(name: str, p: Mapping[str, Any]) -> Topology:
    return _nvidia_hgx(
        name,
        f"NVIDIA DGX A100 x {p['nodes']}: 8 A100 SXM4 80GB per node on NVSwitch (NVLink 3), "
        f"8 x 200 Gb/s HDR InfiniBand per node ({p['fabric']})",
        [
            "docs/hardware.md GPU memory bandwidth: A100 80GB 2.0 TB/s",
            "docs/hardware.md 'NVLink 3 (A100)' row: 12 links x 25 GB/s = 300 GB/s per GPU per direction",
            "docs/hardware.md 'InfiniBand' row: HDR 200 Gb/s per port",
            "NVIDIA DGX A100 datasheet: 2x AMD EPYC 7742, 8x single-port ConnectX-6 200Gb/s HDR",
            "fixture nvidia-smi-topo-m.dgx-a100.txt: GPU pairs share a PCIe switch tree with 2 NICs (PXB)",
            "docs/hardware.md 'CPU socket link' row: AMD ~16 GB/s (NCCL AMD_BW)",
            _SRC_PCIE4, _SRC_NCCL_LAT, _SRC_SWITCH, _SRC_LEAF,
        ],
        gpus=GpuSpec(count=8, model="A100-SXM4-80GB", mem_bw_gbps=2000.0, mem_gb=80.0),
        # One logical NVSwitch for the 6 gen-2 NVSwitch chips: 300 GB/s per GPU (HW: NVLink 3 row).
        fabric=FabricSpec(kind=FabricKind.NVSWITCH, bw_gbps=300.0, count=12, generation=3, latency_us=_NVSWITCH_LAT),
        cpus=CpuSpec(count=2, model="EPYC-7742",
                     link=SocketLinkSpec(kind=LinkKind.INFINITY_FABRIC, bw_gbps=16.0, latency_us=_SOCKET_LAT)),
        # 4 Gen4 switch trees, each 2 GPUs + 2 NICs (fixture: GPU0/1 PXB mlx5_0/1).
        pcie=_PCIE4.model_copy(update={"switches": 4}),
        # 8 x ConnectX-6 HDR 200 Gb/s = 25 GB/s, GPU k <-> NIC k.
        nics=NicSpec(count=8, model="ConnectX-6-HDR", bw_gbps=25.0),
        p=p, cost=ATTN_AMPERE,
    )


def _mi300x(name: str, p: Mapping[str, Any]) -> Topology:
    gpus, nodes = p["gpus"], p["nodes"]
    spec = CompactFile(
        name=name,
        description=f"AMD Instinct MI300X x {gpus} per node x {nodes}: xGMI full mesh (one 64 GB/s link per "
        f"GPU pair), 400 Gb/s RoCE NIC per GPU ({p['fabric']})",
        sources=[
            "docs/hardware.md GPU memory bandwidth: MI300X 5.3 TB/s; AMD MI300X datasheet: 192 GB HBM3",
            "docs/hardware.md 'xGMI / Infinity Fabric (MI300X)' row: 64 GB/s per link per direction, full mesh, "
            "one link per GPU pair",
            "docs/hardware.md 'RoCE 400G' row: MI300X nodes in the paper's setup",
            "NCCL src/graph/topo.h AMD_ZEN34_BW 24.0 GB/s (EPYC Genoa socket link)",
            "fixture rocm-smi-showtopo.8x-mi308x.txt: GPU0-3 on NUMA node 0, GPU4-7 on NUMA node 1",
            _SRC_PCIE5, _SRC_NCCL_LAT, _SRC_SWITCH,
            "PCIe layout (one switch per GPU/NIC pair) assumed like HGX (Azure NDv5 topology file)",
        ],
        nodes=nodes,
        node=NodeSpec(
            gpus=GpuSpec(count=gpus, model="MI300X", mem_bw_gbps=5300.0, mem_gb=192.0),
            cpus=CpuSpec(count=2, model="EPYC-9654",
                         link=SocketLinkSpec(kind=LinkKind.INFINITY_FABRIC, bw_gbps=24.0, latency_us=_SOCKET_LAT)),
            pcie=_PCIE5.model_copy(update={"switches": gpus}),
            fabric=FabricSpec(kind=FabricKind.FULL_MESH, link=LinkKind.XGMI, bw_gbps=64.0, count=1,
                              latency_us=_DIRECT_LAT),
            # 400 Gb/s = 50 GB/s RoCE, one NIC per GPU (HW: RoCE 400G row).
            nics=NicSpec(count=gpus, model="RoCE-400G", bw_gbps=50.0),
        ),
        network=_network(LinkKind.ROCE, p) if nodes > 1 else None,
    )
    return build_compact(spec)


def _rtx4090(name: str, p: Mapping[str, Any]) -> Topology:
    gpus = p["gpus"]
    two = gpus == 8
    spec = CompactFile(
        name=name,
        description=f"{gpus} x RTX 4090 on PCIe 4.0 x16, no GPU peer-to-peer (copies bounce through host memory)"
        + ("; two sockets, one PCIe switch of 4 GPUs per socket" if two else "; one socket, GPUs on CPU root ports"),
        sources=[
            "docs/hardware.md GPU memory bandwidth: RTX 4090 1.0 TB/s; NVIDIA RTX 4090 spec: 24 GB GDDR6X",
            "docs/hardware.md 'PCIe 4.0 x16' row: RTX 4090 has no GPU peer-to-peer",
            _SRC_PCIE4, _SRC_NCCL_LAT,
        ] + ([
            "docs/hardware.md 'CPU socket link' row: Intel Skylake ~10 GB/s (NCCL SKL_QPI_BW), assumed CPU class",
            "dual-root layout (one PCIe switch per socket) assumed, as in 8-GPU PCIe servers",
        ] if two else []),
        node=NodeSpec(
            gpus=GpuSpec(count=gpus, model="RTX-4090", mem_bw_gbps=1000.0, mem_gb=24.0, p2p=False),
            cpus=CpuSpec(count=2, model="Xeon-Scalable",
                         link=SocketLinkSpec(kind=LinkKind.UPI, bw_gbps=10.0, latency_us=_SOCKET_LAT))
            if two else CpuSpec(count=1),
            pcie=_PCIE4.model_copy(update={"switches": 2 if two else 0}),
        ),
    )
    return build_compact(spec)


def _gb200(name: str, p: Mapping[str, Any]) -> Topology:
    racks = p["racks"]
    spec = CompactFile(
        name=name,
        description=f"NVIDIA GB200 NVL72 x {racks}: 72 B200 GPUs per rack in one NVLink 5 domain (900 GB/s per "
        "GPU), 18 compute trays (nodes) of 2 Grace CPUs + 4 GPUs, 4 x 400 Gb/s NICs per tray",
        sources=[
            "docs/hardware.md 'NVLink 5 (B200/GB200)' row: 18 links x 50 GB/s = 900 GB/s per GPU, 72 GPUs in one "
            "NVLink domain",
            "docs/hardware.md GPU memory bandwidth: B200 8 TB/s; NVIDIA GB200 NVL72 spec: 13.4 TB HBM3e per 72 GPUs "
            "(~186 GB each), 18 compute trays",
            "NVIDIA GB200 spec: NVLink-C2C 900 GB/s bidirectional between Grace and Blackwell (450 per direction "
            "used per GPU; sharing between the two GPUs of a superchip not modelled)",
            "NVIDIA GB200 NVL72 compute tray: 4 x ConnectX-7 400 Gb/s (one per GPU); Grace-to-Grace link in a "
            "tray not modelled",
            _SRC_PCIE5, _SRC_NCCL_LAT, _SRC_SWITCH,
        ],
        nodes=18 * racks,
        node=NodeSpec(
            gpus=GpuSpec(count=4, model="B200-GB200", mem_bw_gbps=8000.0, mem_gb=186.0,
                         host_link=HostLinkSpec(kind=LinkKind.C2C, bw_gbps=450.0, latency_us=_PCIE_LAT)),
            cpus=CpuSpec(count=2, model="Grace"),
            pcie=_PCIE5,
            fabric=FabricSpec(kind=FabricKind.NVSWITCH, bw_gbps=900.0, count=18, generation=5,
                              latency_us=_NVSWITCH_LAT, nodes_per_domain=18),
            nics=NicSpec(count=4, model="ConnectX-7-NDR", bw_gbps=50.0),
        ),
        network=_network(LinkKind.INFINIBAND, p), cost=ATTN_BLACKWELL,
    )
    return build_compact(spec)


# CPU-only runs (gloo over TCP loopback). The host terms are a built-in profile: `treeattn
# calibrate` of cpu:ranks=4 with --compute attention on a shared 2-core machine
# (results/cpu-profile/, rounded to 3 digits), with the ranks sharing this machine's cores.
# Per-operation CPU costs do not scale with the core count; how many cores the ranks share
# does. Measured under SCHED_RR (--realtime) so others' work delayed the ranks less; the
# queue is `fair`, as for runs without --realtime. `treeattn calibrate` fits this machine's.
_CPU_MEM_GBPS = 20.0
_CPU_LOOPBACK = {"bw_gbps": 10.4, "flow_gbps": 3.58, "latency_us": 0.0}
_CPU_PROFILE = {"overhead_us": 63.1, "launch_us": 30.2, "mem_efficiency": 0.895, "cpu_us": 63.1,
                "cpu_scope": "machine", "step_us": 7.43, "coll_cpu_us": 17.8, "start_cpu_us": 86.4,
                "cpu_us_per_kb": 0.212, "wakeup_us": 124.0, "attn_launch_us": 199.0, "attn_gbps": 5.72,
                "attn_next_launch_us": 56.3}
_CPU_SOURCE = ("built-in profile: treeattn calibrate of cpu:ranks=4 --compute attention on a shared 2-core machine "
               "(results/cpu-profile); `treeattn calibrate` fits this machine's")


def this_machine_cores() -> int:
    """Cores this process may run on (the ranks' share of the machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cores(v: Any) -> int:
    return this_machine_cores() if v == "this machine" else _int(1)(v)


def _cpu(name: str, p: Mapping[str, Any]) -> Topology:
    try:
        check_rank_count(p["ranks"], f"ranks={p['ranks']}")
    except TopologyError as exc:
        raise FieldError(("params", "ranks"), str(exc)) from None
    # Both named (the core count is this machine's by default): one name, one topology, everywhere.
    name = f"{name.partition(':')[0]}:ranks={p['ranks']},cores={p['cores']}"
    host = Device("host0", DeviceKind.HOST, node=0, model="cpu", mem_bw_gbps=_CPU_MEM_GBPS)
    return Topology(
        name=name,
        description=f"{p['ranks']} CPU ranks (processes) on one host of {p['cores']} cores, gloo over TCP loopback "
                    "(a built-in profile; `treeattn calibrate` fits this machine's figures)",
        devices=(host,),
        links=(Link("host0", "host0", LinkKind.LOOPBACK, **_CPU_LOOPBACK),),
        ranks=("host0",) * p["ranks"],
        sources=(_CPU_SOURCE,),
        cost=CostParams.from_flat(host_cores=p["cores"], **_CPU_PROFILE),
    )


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("dgx-h100", "NVIDIA DGX H100 nodes: 8 H100 on NVSwitch, 8 x 400G NDR rail-optimized",
               _network_params(), _dgx_h100, _network_fields()),
        Family("hgx-h200", "NVIDIA HGX H200 nodes: 8 H200 on NVSwitch, 8 x 400G NDR rail-optimized",
               _network_params(), _hgx_h200, _network_fields()),
        Family("dgx-h200", "NVIDIA DGX H200 nodes (HGX H200 baseboard): 8 H200 on NVSwitch, 8 x 400G NDR",
               _network_params(), _hgx_h200, _network_fields()),
        Family("dgx-a100", "NVIDIA DGX A100 nodes: 8 A100 on NVSwitch, 8 x 200G HDR rail-optimized",
               _network_params(), _dgx_a100, _network_fields()),
        Family("mi300x", "AMD MI300X nodes: xGMI full mesh (64 GB/s per pair), 400G RoCE per GPU",
               (Param("gpus", 8, _choice(8, 4), "GPUs per node"), *_network_params()), _mi300x,
               {**_network_fields(), **_GPUS_FIELDS}),
        Family("rtx4090", "RTX 4090 PCIe box (no peer-to-peer): 2 GPUs on one socket or 8 over two sockets",
               (Param("gpus", 8, _choice(2, 8), "GPUs in the box"),), _rtx4090, _GPUS_FIELDS),
        Family("gb200-nvl72", "NVIDIA GB200 NVL72 racks: 72 GPUs per NVLink 5 domain, trays of 4 GPUs",
               _network_params("racks"), _gb200, _network_fields("racks")),
        Family("cpu", "CPU-only: N ranks on one host over loopback (gloo), a built-in host profile",
               (Param("ranks", 4, _int(1), "ranks (processes)"),
                Param("cores", "this machine", _cores, "CPU cores the ranks share")), _cpu),
    )
}


def parse_family_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``NAME:key=value,...`` into the name and raw parameters.

    Args:
        spec: e.g. ``dgx-h100:nodes=4,oversubscription=2``.

    Returns:
        ``(name, {key: value})``.
    """
    name, _, rest = spec.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise TopologyError(f"topology {spec!r}: parameter {item!r} is not key=value")
        if key.strip() in params:  # the last would silently win: a typo'd spec must not build another cluster
            raise TopologyError(f"topology {spec!r}: parameter {key.strip()!r} is given twice")
        params[key.strip()] = value.strip()
    return name.strip(), params


def build_family(name: str, params: Mapping[str, Any] | None = None) -> Topology:
    """Build a family member.

    Args:
        name: a key of ``FAMILIES``.
        params: parameter values (text or numbers); missing ones take their defaults.

    Returns:
        The topology, named ``NAME`` or ``NAME:k=v,...`` (non-default parameters).
    """
    fam = FAMILIES.get(name)
    if fam is None:
        raise FieldError(("family",), f"unknown family {name!r}; choose one of {', '.join(sorted(FAMILIES))}")
    params = dict(params or {})
    known = {p.name: p for p in fam.params}
    for key in params:
        if key not in known:
            hint = difflib.get_close_matches(str(key), list(known), n=1)
            meant = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise FieldError(("params", key), f"family {name} has no parameter {key!r}{meant}; "
                             f"parameters: {', '.join(known) or 'none'}")
    values: dict[str, Any] = {}
    shown = []
    for p in fam.params:
        raw = params.get(p.name, p.default)
        try:
            values[p.name] = p.parse(raw)
        except ValueError as exc:
            raise FieldError(("params", p.name), f"{p.name} {exc} (got {raw!r})") from None
        if p.name in params and values[p.name] != p.parse(p.default):
            shown.append(f"{p.name}={values[p.name]}")
    full = name + (":" + ",".join(shown) if shown else "")
    try:
        return fam.build(full, values)
    except FieldError as exc:
        if exc.loc[:1] == ("params",):
            raise
        param = fam.fields.get(exc.loc)
        if param is None:  # a figure of the family's own, not one its parameters set
            raise FieldError(("params",), f"{format_loc(exc.loc)}: {exc.message}") from None
        raise FieldError(("params", param), exc.message) from None


def build_family_file(spec: FamilyFile) -> Topology:
    """Build the topology a ``family:`` file names, with its overrides applied."""
    try:
        topo = build_family(spec.family, spec.params)
    except FieldError as exc:
        unknown_param = exc.loc[:1] == ("params",) and len(exc.loc) > 1 and exc.loc[1] not in {
            p.name for p in FAMILIES[spec.family].params}
        if exc.loc == ("family",) or unknown_param:
            raise  # an unknown family or parameter: its message names the family already
        raise FieldError(exc.loc, f"family {spec.family}: {exc.message}") from None
    changes: dict[str, Any] = {"sources": (*topo.sources, *spec.sources)}
    if spec.name is not None:
        changes["name"] = spec.name
    if spec.description is not None:
        changes["description"] = spec.description
    if spec.cost is not None:  # the terms it gives, over the family's own (its decode-kernel fit)
        changes["cost"] = topo.cost.updated(**spec.cost.model_dump(exclude_unset=True))
    return dataclasses.replace(topo, **changes)
