"""Live discovery from Linux sysfs (no vendor tools needed), rooted anywhere for tests.

Read under ``root``: ``sys/bus/pci/devices/*`` (links into ``sys/devices/pci<domain>:<bus>/...``
whose path is the PCIe tree; each device's ``class``, ``vendor``, ``device``, ``numa_node``,
``current_link_speed``, ``current_link_width``), ``sys/devices/system/node/node*`` (NUMA
nodes), ``sys/class/infiniband/*/device`` and ``ports/*/{rate,state,link_layer}`` (RDMA NICs),
``sys/class/net/*/{device,speed}`` (plain Ethernet) and ``proc/cpuinfo`` (``vendor_id``,
``model``, for the socket link).

GPUs: NVIDIA (0x10de) or AMD (0x1002) devices of class 0x03xxxx (AMD also 0x1200xx). NICs:
class 0x0207xx (InfiniBand) and 0x0200xx (Ethernet); plain Ethernet NICs are dropped when an
RDMA NIC exists. The PCIe tree keeps the bridges where endpoint paths branch (PCIe switches);
a chain of single-child bridges becomes one link at the slowest speed along it. sysfs does
not show NVLink or xGMI wiring: GPUs found here are joined over PCIe only (a warning says so).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from treeattn.probe.build import NicInfo, NodeDraft
from treeattn.probe.gpus import GpuCatalog
from treeattn.probe.hardware import gpu_spec_by_pci_id, pcie_bw_gbps, pcie_gen_from_speed, socket_link
from treeattn.topology.model import Device, DeviceKind, LinkKind

__all__ = ["PciDevice", "scan_pci", "sysfs_to_draft"]

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True, slots=True)
class PciDevice:
    bdf: str
    cls: int
    vendor: int
    device: int
    numa: int
    """-1 when the kernel does not know."""
    chain: tuple[str, ...]
    """BDFs of the bridges above it, top first."""
    speed: str
    width: int | None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _int(text: str, base: int = 10) -> int | None:
    try:
        return int(text, base)
    except ValueError:
        return None


def scan_pci(root: Path) -> dict[str, PciDevice]:
    """Every PCI device under ``root/sys/bus/pci/devices``, with the bridges above it."""
    base = root / "sys" / "bus" / "pci" / "devices"
    out: dict[str, PciDevice] = {}
    if not base.is_dir():
        return out
    for entry in sorted(base.iterdir()):
        real = Path(os.path.realpath(entry))
        parts = [p for p in real.parts if _BDF.match(p)]
        if not parts or parts[-1] != entry.name:
            continue
        cls = _int(_read(real / "class"), 16)
        if cls is None:
            continue
        width = _int(_read(real / "current_link_width"))
        out[entry.name] = PciDevice(
            bdf=entry.name,
            cls=cls,
            vendor=_int(_read(real / "vendor"), 16) or 0,
            device=_int(_read(real / "device"), 16) or 0,
            numa=_int(_read(real / "numa_node")) if _int(_read(real / "numa_node")) is not None else -1,
            chain=tuple(parts[:-1]),
            speed=_read(real / "current_link_speed"),
            width=width,
        )
    return out


def _is_gpu(d: PciDevice) -> bool:
    if d.vendor == 0x10DE:
        return d.cls >> 16 == 0x03
    if d.vendor == 0x1002:
        return d.cls >> 16 == 0x03 or d.cls >> 8 == 0x1200
    return False


def _nic_names(root: Path) -> tuple[dict[str, tuple[str, NicInfo]], dict[str, tuple[str, NicInfo]]]:
    """BDF -> (name, info) for RDMA devices and for plain network interfaces."""
    rdma: dict[str, tuple[str, NicInfo]] = {}
    ib = root / "sys" / "class" / "infiniband"
    for dev in sorted(ib.iterdir()) if ib.is_dir() else ():
        bdf = Path(os.path.realpath(dev / "device")).name
        best: NicInfo | None = None
        ports = dev / "ports"
        for port in sorted(ports.iterdir()) if ports.is_dir() else ():
            m = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", _read(port / "rate"))
            state = _read(port / "state").split(":")[-1].strip().capitalize() or None
            info = NicInfo(float(m.group(1)) if m else None, _read(port / "link_layer") or None, state)
            if best is None or (info.state == "Active" and best.state != "Active"):
                best = info
        rdma.setdefault(bdf, (dev.name, best or NicInfo()))
    plain: dict[str, tuple[str, NicInfo]] = {}
    net = root / "sys" / "class" / "net"
    for dev in sorted(net.iterdir()) if net.is_dir() else ():
        link = dev / "device"
        if not link.exists():
            continue
        speed = _int(_read(dev / "speed"))
        info = NicInfo(speed / 1000.0 if speed and speed > 0 else None, "Ethernet", None, rdma=False)
        plain.setdefault(Path(os.path.realpath(link)).name, (dev.name, info))
    return rdma, plain


def _cpu_vendor(root: Path) -> tuple[str, int | None]:
    vendor, model = "", None
    for line in _read(root / "proc" / "cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key.strip() == "model" and model is None:
            model = _int(value.strip())
        if vendor and model is not None:
            break
    return vendor, model


def _numa_nodes(root: Path) -> list[int]:
    base = root / "sys" / "devices" / "system" / "node"
    nodes = []
    for d in sorted(base.glob("node[0-9]*")) if base.is_dir() else ():
        if _read(d / "cpulist"):
            nodes.append(int(d.name[4:]))
    return sorted(nodes)


def sysfs_to_draft(root: str | Path = "/", catalog: GpuCatalog | None = None) -> NodeDraft:
    """Discover this machine (or the tree under ``root``) from sysfs.

    Args:
        root: filesystem root holding ``sys/`` and ``proc/`` (``/`` on a live machine).
        catalog: ``--gpu-model`` (wins over PCI device ids).

    Returns:
        The draft; it has no GPU when none was found (the caller falls back to a CPU host).
    """
    root = Path(root)
    catalog = catalog or GpuCatalog()
    d = NodeDraft()
    pci = scan_pci(root)
    gpus = [p for p in pci.values() if _is_gpu(p)]
    if not gpus:
        return d
    rdma, plain = _nic_names(root)
    nics: list[tuple[PciDevice, str, NicInfo]] = []
    for p in pci.values():
        if p.cls >> 8 not in (0x0207, 0x0200):
            continue
        if p.bdf in rdma:
            nics.append((p, *rdma[p.bdf]))
        elif p.bdf in plain:
            nics.append((p, *plain[p.bdf]))
    if any(info.rdma for _, _, info in nics):
        dropped = [name for _, name, info in nics if not info.rdma]
        nics = [n for n in nics if n[2].rdma]
        if dropped:
            d.note(f"plain Ethernet NICs left out (RDMA NICs present): {', '.join(dropped)}")

    numa_nodes = _numa_nodes(root) or [0]
    ends = [(p, f"gpu{i}") for i, p in enumerate(gpus)] + [(p, name) for p, name, _ in nics]
    unknown_numa = [name for p, name in ends if p.numa < 0 or p.numa not in numa_nodes]
    if unknown_numa:
        d.warnings.append(f"sysfs: NUMA node unknown for {', '.join(unknown_numa)}; NUMA node {numa_nodes[0]} used")

    def numa_of(p: PciDevice) -> int:
        return p.numa if p.numa in numa_nodes else numa_nodes[0]

    used_nodes = sorted({numa_of(p) for p, _ in ends})
    for n in used_nodes:
        d.add(Device(f"cpu{n}", DeviceKind.CPU, 0))
    # Bridges where two or more endpoint paths part are PCIe switches.
    children: dict[str, set[str]] = {}
    for p, _ in ends:
        path = [*p.chain, p.bdf]
        for up, down in zip(path, path[1:], strict=False):
            children.setdefault(up, set()).add(down)
    branch = [b for b, kids in children.items() if len(kids) > 1]
    names = {b: f"pcie{i}" for i, b in enumerate(sorted(branch))}
    defaults = [0]

    def link_up(p_bdf: str, chain: tuple[str, ...]) -> tuple[str, float, int, int]:
        """(parent name, GB/s, gen, width) for a device whose ancestors are ``chain``."""
        hops = [p_bdf]
        parent = None
        for up in reversed(chain):
            if up in names:
                parent = names[up]
                break
            hops.append(up)
        best: tuple[float, int, int] | None = None
        for h in hops:
            dev = pci.get(h)
            gen = pcie_gen_from_speed(dev.speed) if dev else None
            if dev is None or gen is None or not dev.width:
                continue
            bw = pcie_bw_gbps(gen, dev.width)
            if best is None or bw < best[0]:
                best = (bw, gen, dev.width)
        if best is None:
            defaults[0] += 1
            best = (pcie_bw_gbps(4), 4, 16)
        return parent or "", *best

    for b in sorted(branch):
        d.add(Device(names[b], DeviceKind.PCIE_SWITCH, 0))
    for b in sorted(branch):
        dev = pci.get(b)
        chain = dev.chain if dev else ()
        node = numa_of(dev) if dev else used_nodes[0]
        parent, bw, gen, width = link_up(b, chain)
        d.connect(names[b], parent or f"cpu{node}", LinkKind.PCIE, bw, generation=gen, width=width)

    names_from_ids = []
    for p in gpus:
        spec = gpu_spec_by_pci_id(p.vendor, p.device)
        names_from_ids.append(spec.model if spec else "")
    specs = GpuCatalog(tuple(names_from_ids) if all(names_from_ids) else (), catalog.model).apply(
        d, len(gpus), "sysfs"
    )
    for i, (p, spec) in enumerate(zip(gpus, specs, strict=True)):
        d.add(Device(f"gpu{i}", DeviceKind.GPU, 0, spec.model, spec.mem_bw_gbps, spec.mem_gb, spec.p2p))
        parent, bw, gen, width = link_up(p.bdf, p.chain)
        d.connect(f"gpu{i}", parent or f"cpu{numa_of(p)}", LinkKind.PCIE, bw, generation=gen, width=width)
    for p, name, info in nics:
        d.add(Device(name, DeviceKind.NIC, 0))
        d.nics[name] = info
        parent, bw, gen, width = link_up(p.bdf, p.chain)
        d.connect(name, parent or f"cpu{numa_of(p)}", LinkKind.PCIE, bw, generation=gen, width=width)
    if defaults[0]:
        d.note(f"{defaults[0]} PCIe link(s) without a readable speed/width in sysfs: Gen4 x16 assumed")

    vendor, model = _cpu_vendor(root)
    d.name_cpus(vendor)
    kind, sbw, label = socket_link(vendor, model)
    if len(used_nodes) > 1:
        d.note(f"socket links between NUMA nodes {used_nodes}: {label}")
        for i, a in enumerate(used_nodes):
            for b in used_nodes[i + 1:]:
                d.connect(f"cpu{a}", f"cpu{b}", kind, sbw)
    switches = sum(1 for p in pci.values() if p.vendor == 0x10DE and p.cls >> 8 == 0x0680)
    if len(gpus) > 1:
        extra = f" ({switches} NVSwitch PCI device(s) seen)" if switches else ""
        d.warnings.append(
            "sysfs: NVLink/xGMI wiring is not visible in sysfs" + extra + "; GPUs are joined over PCIe only. "
            "Run where nvidia-smi/rocm-smi works or pass --from-nvidia-smi/--from-rocm-smi"
        )
    d.summary.append(f"{len(nics)} NICs" if nics else "no NICs")
    d.summary.append(f"{len(branch)} PCIe switch(es)")
    d.summary.append(f"{len(used_nodes)} NUMA node(s)")
    return d
