"""Datasheet figures the probe fills in where tool output says *what* but not *how fast*.

Every number is a default that ``calibrate`` replaces. Rows cite docs/hardware.md
("Links" table and "GPU memory bandwidth") or the
vendor datasheet named beside them. Legend: ``_gbps`` GB/s per direction, ``_us`` µs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from treeattn.topology.model import LinkKind
from treeattn.topology.plausible import NVLINK_PER_LINK_GBPS, XGMI_PER_LINK_GBPS

__all__ = [
    "GpuSpec",
    "GPU_SPECS",
    "UNKNOWN_GPU_MEM_BW_GBPS",
    "gpu_spec",
    "gpu_spec_by_pci_id",
    "nvlink_gen_by_sm",
    "NVLINK_PER_LINK_GBPS",
    "XGMI_PER_LINK_GBPS",
    "XGMI_RCCL_PER_LINK_GBPS",
    "pcie_gen_from_speed",
    "pcie_bw_gbps",
    "socket_link",
    "LATENCY_US",
    "NVSWITCH_LINK_LATENCY_US",
    "SOURCE_HARDWARE",
]

SOURCE_HARDWARE = "docs/hardware.md (treeattn reference figures: link and GPU memory bandwidth tables)"


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What the topology needs to know about one GPU product."""

    model: str
    """Canonical name written into ``Device.model``."""
    vendor: str
    """``nvidia`` or ``amd``."""
    mem_bw_gbps: float
    mem_gb: float
    fabric_gen: int | None
    """NVLink generation (2-5); for AMD, 0 means xGMI; None: no GPU fabric."""
    max_links: int
    """NVLinks / xGMI links per GPU (0 when none)."""
    per_link_gbps: float
    pcie_gen: int
    p2p: bool
    source: str


# model            vendor  mem GB/s  GB  fabric links link GB/s pcie p2p  source
_ROWS: tuple[tuple, ...] = (
    ("V100-SXM2-16GB", "nvidia", 900, 16, 2, 6, 25.0, 3, True, "NVIDIA V100 datasheet: 900 GB/s HBM2, NVLink 300 GB/s"),
    ("V100-SXM2-32GB", "nvidia", 900, 32, 2, 6, 25.0, 3, True, "NVIDIA V100 datasheet: 900 GB/s HBM2, NVLink 300 GB/s"),
    ("V100-PCIE", "nvidia", 900, 32, None, 0, 0.0, 3, True, "NVIDIA V100 datasheet"),
    ("A100-SXM4-40GB", "nvidia", 1555, 40, 3, 12, 25.0, 4, True, "NVIDIA A100 datasheet: 1,555 GB/s"),
    ("A100-SXM4-80GB", "nvidia", 2039, 80, 3, 12, 25.0, 4, True, "docs/hardware.md: A100 80GB 2.0 TB/s, NVLink 3"),
    ("A100-PCIE-40GB", "nvidia", 1555, 40, 3, 12, 25.0, 4, True, "NVIDIA A100 datasheet: 1,555 GB/s"),
    ("A100-PCIE-80GB", "nvidia", 1935, 80, 3, 12, 25.0, 4, True, "NVIDIA A100 datasheet: 1,935 GB/s (PCIe)"),
    ("H100-SXM5-80GB", "nvidia", 3350, 80, 4, 18, 25.0, 5, True, "docs/hardware.md: H100 SXM 3.35 TB/s, NVLink 4"),
    ("H100-PCIE-80GB", "nvidia", 2000, 80, 4, 12, 25.0, 5, True, "NVIDIA H100 datasheet: H100 PCIe 2 TB/s"),
    ("H100-NVL-94GB", "nvidia", 3900, 94, 4, 12, 25.0, 5, True, "NVIDIA H100 datasheet: H100 NVL 3.9 TB/s"),
    ("H200-SXM-141GB", "nvidia", 4800, 141, 4, 18, 25.0, 5, True, "docs/hardware.md: H200 4.8 TB/s, NVLink 4"),
    ("B200", "nvidia", 8000, 180, 5, 18, 50.0, 5, True, "docs/hardware.md: B200 8 TB/s, NVLink 5"),
    # NOTE: GeForce cards do not do PCIe peer-to-peer (docs/hardware.md PCIe 4.0 row, RTX 4090);
    # the 5090 is assumed to follow the same product policy.
    ("RTX-4090", "nvidia", 1008, 24, None, 0, 0.0, 4, False, "docs/hardware.md: RTX 4090 1.0 TB/s, no P2P"),
    ("RTX-5090", "nvidia", 1792, 32, None, 0, 0.0, 5, False, "NVIDIA RTX 5090 spec: 1,792 GB/s"),
    ("RTX-3090", "nvidia", 936, 24, 3, 4, 14.0625, 4, True, "NVIDIA RTX 3090 spec: 936 GB/s, NVLink bridge 112.5 GB/s"),
    ("L40S", "nvidia", 864, 48, None, 0, 0.0, 4, True, "NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, PCIe 4.0 x16, no "
     "NVLink"),
    ("A10", "nvidia", 600, 24, None, 0, 0.0, 4, True, "NVIDIA A10 datasheet: 24 GB GDDR6, 600 GB/s, PCIe 4.0 x16, no "
     "NVLink"),
    # NOTE: AWS G5's A10G memory figures assumed equal to the A10's (same GA102 part, 24 GB GDDR6); not verified.
    ("A10G", "nvidia", 600, 24, None, 0, 0.0, 4, True, "AWS G5: NVIDIA A10G, 24 GB; 600 GB/s assumed as the A10 "
     "datasheet's"),
    ("A40", "nvidia", 696, 48, 3, 4, 14.0625, 4, True, "NVIDIA A40 datasheet: 48 GB GDDR6, 696 GB/s, NVLink bridge "
     "112.5 GB/s bidirectional, PCIe 4.0 x16"),
    ("L4-24GB", "nvidia", 300, 24, None, 0, 0.0, 4, True, "NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, PCIe 4.0 x16, "
     "no NVLink"),
    ("MI300X", "amd", 5300, 192, 0, 7, 64.0, 5, True, "docs/hardware.md: MI300X 5.3 TB/s, xGMI 64 GB/s per link"),
    # NOTE: MI308X memory figures assumed equal to MI300X (same HBM3 stack); not verified.
    ("MI308X", "amd", 5300, 192, 0, 7, 64.0, 5, True, "assumed as MI300X (docs/hardware.md); not verified"),
    ("MI325X", "amd", 6000, 256, 0, 7, 64.0, 5, True, "AMD MI325X datasheet: 6 TB/s"),
)

GPU_SPECS: dict[str, GpuSpec] = {r[0]: GpuSpec(*r) for r in _ROWS}

UNKNOWN_GPU_MEM_BW_GBPS = 1000.0
"""Placeholder memory bandwidth for a GPU whose model is not known (a warning says so)."""

# A product number counts as a whole word of the name: "H1000" or "RTX 40900" is no H100 or
# RTX 4090, and "A10" of "NVIDIA A10" is not the "A10" in "A100".
_B, _E = r"(?<![A-Z0-9])", r"(?![A-Z0-9])"

# Name patterns as nvidia-smi / rocm-smi / nccl-tests print them, most specific first.
_NAME_PATTERNS: tuple[tuple[str, str], ...] = tuple((p.format(b=_B, e=_E), m) for p, m in (
    (r"{b}V100{e}.*SXM2.*32", "V100-SXM2-32GB"),
    (r"{b}V100{e}.*SXM2", "V100-SXM2-16GB"),
    (r"{b}V100{e}", "V100-PCIE"),
    (r"{b}A100{e}.*SXM.*80", "A100-SXM4-80GB"),
    (r"{b}A100{e}.*SXM", "A100-SXM4-40GB"),
    (r"{b}A100{e}.*80\s*GB.*PCIE|{b}A100{e}.*PCIE.*80", "A100-PCIE-80GB"),
    (r"{b}A100{e}.*PCIE", "A100-PCIE-40GB"),
    (r"{b}H100{e}.*NVL", "H100-NVL-94GB"),
    (r"{b}H100{e}.*PCIE", "H100-PCIE-80GB"),
    (r"{b}H100{e}", "H100-SXM5-80GB"),  # "H100 80GB HBM3" is the SXM5 part
    # Not GH200 ("NVIDIA GH200 480GB"): a Grace Hopper superchip whose HBM (about 96 GiB on that
    # part, as nvidia-smi shows it) read as an H200's 141 would overstate what plan's memory check allows.
    (r"{b}H200{e}", "H200-SXM-141GB"),
    # "NVIDIA GB200": the Blackwell GPU of a GB200 superchip (186 GB there; B200's 180 understates it).
    (r"{b}G?B200{e}", "B200"),
    (r"{b}RTX\s*4090{e}", "RTX-4090"),
    (r"{b}RTX\s*5090{e}", "RTX-5090"),
    (r"{b}RTX\s*3090{e}", "RTX-3090"),
    (r"{b}L40S{e}", "L40S"),
    (r"{b}A10G{e}", "A10G"),  # "NVIDIA A10G" (AWS G5)
    (r"{b}A10{e}", "A10"),
    (r"{b}A40{e}", "A40"),
    (r"{b}L4{e}", "L4-24GB"),
    (r"{b}MI300X{e}", "MI300X"),
    (r"{b}MI308X{e}", "MI308X"),
    (r"{b}MI325X{e}", "MI325X"),
))

# PCI device ids (vendor:device) from the PCI ID repository.
_PCI_IDS: dict[tuple[int, int], str] = {
    (0x10DE, 0x1DB1): "V100-SXM2-16GB",
    (0x10DE, 0x1DB5): "V100-SXM2-32GB",
    (0x10DE, 0x20B0): "A100-SXM4-40GB",
    (0x10DE, 0x20B2): "A100-SXM4-80GB",
    (0x10DE, 0x20F1): "A100-PCIE-40GB",
    (0x10DE, 0x20B5): "A100-PCIE-80GB",
    (0x10DE, 0x2330): "H100-SXM5-80GB",
    (0x10DE, 0x2331): "H100-PCIE-80GB",
    (0x10DE, 0x2335): "H200-SXM-141GB",
    (0x10DE, 0x2684): "RTX-4090",
    (0x10DE, 0x2204): "RTX-3090",
    (0x1002, 0x74A1): "MI300X",
    (0x1002, 0x74A2): "MI308X",  # per the ms-swift rocm-smi fixture notes; not verified
}


def gpu_spec(name: str) -> GpuSpec | None:
    """The spec for a GPU product name as tools print it (``NVIDIA H100 80GB HBM3``).

    Args:
        name: product name, any case; canonical names (``H100-SXM5-80GB``) work too.

    Returns:
        The matching spec, or None when the name is not known.
    """
    text = name.strip().upper()
    if text in (k.upper() for k in GPU_SPECS):
        return next(v for k, v in GPU_SPECS.items() if k.upper() == text)
    for pattern, model in _NAME_PATTERNS:
        if re.search(pattern, text):
            return GPU_SPECS[model]
    return None


def gpu_spec_by_pci_id(vendor: int, device: int) -> GpuSpec | None:
    """The spec for a PCI vendor/device id pair, or None when not known."""
    model = _PCI_IDS.get((vendor, device))
    return GPU_SPECS[model] if model else None


def nvlink_gen_by_sm(sm: int) -> int | None:
    """NVLink generation of a compute capability (NCCL's ``sm`` attribute), None if none."""
    if sm >= 100:
        return 5
    if sm >= 90:
        return 4
    if sm in (80, 86, 87):
        return 3
    if sm == 89:
        return None  # Ada (RTX 4090, L40): no NVLink
    if sm >= 70:
        return 2
    if sm == 60:  # P100 (SXM2): NVLink 1
        return 1
    return None


XGMI_RCCL_PER_LINK_GBPS = 48.0
"""What RCCL models for a gfx94x xGMI link (docs/hardware.md, AMD section); kept for reference."""

# Usable GB/s per lane per direction: docs/hardware.md gives 4.0 x16 ~25 usable (31.5 nominal) and
# 5.0 x16 ~55 measured (63 nominal); the other generations take 80 % of their nominal rate.
_PCIE_LANE_GBPS = {1: 0.2, 2: 0.4, 3: 0.788, 4: 25.0 / 16, 5: 55.0 / 16, 6: 6.05}
_GT_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_gen_from_speed(text: str) -> int | None:
    """PCIe generation of a link speed string (``16 GT/s``, ``32.0 GT/s PCIe``), None if unreadable."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*GT/s", text or "")
    if not m:
        return None
    return _GT_TO_GEN.get(float(m.group(1)))


def pcie_bw_gbps(gen: int, width: int = 16) -> float:
    """Usable per-direction bandwidth of a PCIe link (x16: Gen4 25, Gen5 55 GB/s, docs/hardware.md)."""
    return round(_PCIE_LANE_GBPS[gen] * width, 3)


def socket_link(vendor: str, model: int | None) -> tuple[LinkKind, float, str]:
    """Kind, GB/s and a label of the CPU socket interconnect (docs/hardware.md CPU socket link row).

    Args:
        vendor: ``GenuineIntel``/``AuthenticAMD`` (or ``intel``/``amd``); anything else is unknown.
        model: x86 model number (``/proc/cpuinfo`` ``model``, NCCL ``modelid``), None if unknown.

    Returns:
        ``(kind, bw_gbps, label)``; unknown vendors get Intel Skylake's 10 GB/s, the lowest.
    """
    v = (vendor or "").lower()
    if "amd" in v:
        return LinkKind.INFINITY_FABRIC, 16.0, "AMD Infinity Fabric (NCCL constant 16 GB/s)"
    if "intel" in v:
        if model == 207:
            return LinkKind.UPI, 40.0, "Intel Emerald Rapids UPI (NCCL constant 40 GB/s)"
        if model == 143:
            return LinkKind.UPI, 22.0, "Intel Sapphire Rapids UPI (NCCL constant 22 GB/s)"
        return LinkKind.UPI, 10.0, "Intel UPI/QPI (Skylake NCCL constant 10 GB/s)"
    return LinkKind.UPI, 10.0, "unknown CPU vendor: socket link 10 GB/s (lowest NCCL constant)"


LATENCY_US: dict[LinkKind, float] = {
    LinkKind.NVLINK: 0.6,  # a direct GPU-GPU link is one NCCL NVLink hop, 0.6 µs (docs/hardware.md, LL)
    LinkKind.XGMI: 0.6,  # assumed equal to NVLink
    LinkKind.PCIE: 0.5,  # half of NCCL's 1 µs PCIe hop: GPU -> switch -> GPU is two links
    LinkKind.C2C: 0.5,
    LinkKind.UPI: 0.5,  # no published figure at hand: one PCIe-link-like step
    LinkKind.INFINITY_FABRIC: 0.5,
    LinkKind.INFINIBAND: 0.6,  # switch hop ≈ 0.5-0.6 µs (docs/hardware.md InfiniBand row)
    LinkKind.ROCE: 0.6,
    LinkKind.ETHERNET: 5.0,  # plain TCP over Ethernet, kernel stack on both ends; rough
    LinkKind.LOOPBACK: 20.0,
}
"""Default one-way latency per link, µs (the same figures as ``treeattn.topology.families``);
``calibrate`` replaces them."""

NVSWITCH_LINK_LATENCY_US = 0.3
"""GPU <-> NVSwitch: half of NCCL's 0.6 µs NVLink hop (GPU -> switch -> GPU is two links)."""
