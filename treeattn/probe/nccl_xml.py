"""NCCL topology XML (``NCCL_TOPO_DUMP_FILE`` output, or a hand-written ``NCCL_TOPO_FILE``).

Elements read: ``<system>`` > ``<cpu numaid affinity vendor familyid modelid>`` > nested
``<pci busid class vendor device link_speed link_width>``; a PCI bridge (class 0x0604xx)
is a PCIe switch, a display/3D controller (0x03xxxx) a GPU (with an optional ``<gpu dev sm>``
holding ``<nvlink target count tclass>``), a network controller (0x0200xx Ethernet,
0x0207xx InfiniBand) a NIC (with ``<nic><net name speed(Mb/s) guid/>``; the ports of one
adapter that share a GUID are one device at their summed speed, named ``mlx5_0+mlx5_1``, as
NCCL 2.20.3 and later merges them). A ``<nic>`` directly under a ``<cpu>`` is a NIC on that
CPU. Other PCI devices are skipped (counted in a note).

Model: each ``pci`` element's link to its parent runs at ``link_width`` x its speed
(width 0 read as 16, as NCCL does). NVLinks to a target of class 0x0680xx are NVSwitch
links; all NVSwitch chips are merged into one ``nvswitch`` device (the hardware sprays
traffic over them, one route could not). NVLinks to another GPU are direct links.
Hand-written files often have no ``<gpu>`` elements: NVLink is then unknown and said so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.parsers import expat

from treeattn.probe.build import NicInfo, NodeDraft
from treeattn.probe.gpus import GpuCatalog
from treeattn.probe.hardware import (
    NVLINK_PER_LINK_GBPS,
    NVSWITCH_LINK_LATENCY_US,
    gpu_spec_by_pci_id,
    nvlink_gen_by_sm,
    pcie_bw_gbps,
    pcie_gen_from_speed,
    socket_link,
)
from treeattn.probe.text import fail
from treeattn.topology.model import Device, DeviceKind, LinkKind
from treeattn.topology.schema import PCIE_WIDTHS

__all__ = ["XmlNode", "parse_nccl_xml", "nccl_xml_to_draft"]


@dataclass
class XmlNode:
    """An element with the line it starts on."""

    tag: str
    attrs: dict[str, str]
    line: int
    children: list[XmlNode] = field(default_factory=list)


def parse_nccl_xml(text: str, source: str = "NCCL topology XML") -> XmlNode:
    """Parse the XML into elements with line numbers (no DTDs or entities accepted).

    Args:
        text: the file's text.
        source: file name for messages.

    Returns:
        The ``<system>`` element.

    Raises:
        ProbeError: malformed XML (with its line), a DOCTYPE/ENTITY, or a root other than ``<system>``.
    """
    if re.search(r"<!(DOCTYPE|ENTITY)", text):
        raise fail(source, None, "DOCTYPE/ENTITY declarations are not accepted in a topology file")
    parser = expat.ParserCreate()
    stack: list[XmlNode] = []
    roots: list[XmlNode] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        node = XmlNode(tag, dict(attrs), parser.CurrentLineNumber)
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)

    def end(tag: str) -> None:
        stack.pop()

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    try:
        parser.Parse(text, True)
    except expat.ExpatError as exc:
        raise fail(source, exc.lineno, f"malformed XML: {expat.ErrorString(exc.code)} (column {exc.offset})") from None
    if not roots or roots[0].tag != "system":
        raise fail(source, roots[0].line if roots else None, "the root element must be <system>")
    return roots[0]


def _hex(node: XmlNode, key: str, source: str) -> int | None:
    value = node.attrs.get(key)
    if value is None:
        return None
    try:
        return int(value, 16)
    except ValueError:
        raise fail(source, node.line, f"<{node.tag}> {key}={value!r} is not a hex number") from None


@dataclass
class _Found:
    gpus: list[tuple[XmlNode, XmlNode | None, str]] = field(default_factory=list)
    """(pci element, its <gpu> child or None, parent device name)."""
    nics: list[tuple[XmlNode, list[XmlNode], str, str]] = field(default_factory=list)
    """(element, <net> children, parent, link layer)."""
    skipped: int = 0
    slow: list[str] = field(default_factory=list)
    width0: int = 0
    no_speed: int = 0


def nccl_xml_to_draft(
    root: XmlNode, catalog: GpuCatalog, *, source: str = "NCCL topology XML"
) -> NodeDraft:
    """Devices and links of one machine from an NCCL topology (model in the module docstring).

    Args:
        root: the parsed ``<system>``.
        catalog: ``--gpu-model`` (wins over PCI device ids) or nothing.
        source: input name for messages.

    Returns:
        The draft.

    Raises:
        ProbeError: a missing or unreadable attribute (class, busid, count, speed), a GPU
            or NVLink target repeated, or no ``<cpu>`` element; messages name the line.
    """
    d = NodeDraft()
    found = _Found()
    cpus = [c for c in root.children if c.tag == "cpu"]
    if not cpus:
        raise fail(source, root.line, "no <cpu> element under <system>")
    for other in (c for c in root.children if c.tag != "cpu"):
        d.warnings.append(f"{source}:{other.line}: <{other.tag}> under <system> ignored")
    numas: list[int] = []
    for k, cpu in enumerate(cpus):
        nid = cpu.attrs.get("numaid", str(k))
        if not nid.lstrip("-").isdigit():
            raise fail(source, cpu.line, f"<cpu> numaid={nid!r} is not a number")
        if int(nid) in numas:
            raise fail(source, cpu.line, f"<cpu> numaid={nid} repeats")
        numas.append(int(nid))
        d.add(Device(f"cpu{nid}", DeviceKind.CPU, 0))
    for cpu, nid in zip(cpus, numas, strict=True):
        _walk(cpu, f"cpu{nid}", d, found, source)

    _gpus(d, found, catalog, source)
    _nics(d, found, source)
    if found.skipped:
        d.note(f"{found.skipped} other PCI device(s) (storage, management) left out")
    if found.width0:
        d.note(f"{found.width0} PCI link(s) report width 0: read as x16, as NCCL does")
    if found.no_speed:
        d.note(f"{found.no_speed} PCI link(s) without a readable speed: Gen4 assumed")
    if found.slow:
        d.warnings.append(f"{source}: PCI links far slower than the devices below them (virtualised PCI?), "
                          f"kept as reported: {', '.join(found.slow[:4])}{' ...' if len(found.slow) > 4 else ''}")
    vendor, model = cpus[0].attrs.get("vendor", ""), cpus[0].attrs.get("modelid")
    d.name_cpus(vendor)
    kind, bw, label = socket_link(vendor, int(model) if model and model.isdigit() else None)
    if len(numas) > 1:
        d.note(f"socket links between NUMA nodes {sorted(numas)}: {label}")
        for i, a in enumerate(sorted(numas)):
            for b in sorted(numas)[i + 1:]:
                d.connect(f"cpu{a}", f"cpu{b}", kind, bw)
    d.summary.append(f"{len(numas)} NUMA node(s)")
    return d


def _link_of(pci: XmlNode, found: _Found, source: str) -> tuple[float, int, int]:
    """(GB/s, generation, width) of a pci element's link to its parent."""
    speed = pci.attrs.get("link_speed", "")
    gen = pcie_gen_from_speed(speed)
    if gen is None:
        found.no_speed += 1
        gen = 4
    width_text = pci.attrs.get("link_width", "16")
    if not width_text.isdigit():
        raise fail(source, pci.line, f"<pci> link_width={width_text!r} is not a number")
    width = int(width_text)
    if width and width not in PCIE_WIDTHS:
        raise fail(source, pci.line, f"<pci> link_width={width_text!r} is no PCIe link width "
                   f"({', '.join(map(str, PCIE_WIDTHS))})")
    if width == 0:
        found.width0 += 1
        width = 16
    return pcie_bw_gbps(gen, width), gen, width


def _peek_bw(pci: XmlNode) -> float | None:
    """GB/s of a pci element's link when readable (no notes taken)."""
    gen = pcie_gen_from_speed(pci.attrs.get("link_speed", ""))
    width = pci.attrs.get("link_width", "16")
    if gen is None or not width.isdigit():
        return None
    return pcie_bw_gbps(gen, int(width) or 16)


def _walk(node: XmlNode, parent: str, d: NodeDraft, found: _Found, source: str) -> None:
    for child in node.children:
        if child.tag == "nic":
            nets = [n for n in child.children if n.tag == "net"]
            found.nics.append((child, nets, parent, ""))
            continue
        if child.tag != "pci":
            if node.tag == "cpu":
                d.warnings.append(f"{source}:{child.line}: <{child.tag}> under <cpu> ignored")
            continue
        if "busid" not in child.attrs:
            raise fail(source, child.line, "<pci> without busid")
        cls = _hex(child, "class", source)
        if cls is None:
            raise fail(source, child.line, f"<pci busid={child.attrs['busid']!r}> without class")
        if cls >> 8 == 0x0604:
            name = f"pcie{sum(1 for v in d.devices.values() if v.kind is DeviceKind.PCIE_SWITCH)}"
            d.add(Device(name, DeviceKind.PCIE_SWITCH, 0))
            bw, gen, width = _link_of(child, found, source)
            d.connect(name, parent, LinkKind.PCIE, bw, generation=gen, width=width)
            _walk(child, name, d, found, source)
            below = [b for b in (_peek_bw(c) for c in child.children if c.tag == "pci") if b]
            if below and bw < 0.25 * max(below):
                found.slow.append(f"{child.attrs['busid']} ({child.attrs.get('link_speed')} x{width})")
        elif cls >> 16 == 0x03:
            gpu = next((c for c in child.children if c.tag == "gpu"), None)
            found.gpus.append((child, gpu, parent))
        elif cls >> 8 in (0x0200, 0x0207):
            nic = next((c for c in child.children if c.tag == "nic"), None)
            nets = [n for n in nic.children if n.tag == "net"] if nic else []
            found.nics.append((child, nets, parent, "InfiniBand" if cls >> 8 == 0x0207 else "Ethernet"))
        else:
            found.skipped += 1


def _gpus(d: NodeDraft, found: _Found, catalog: GpuCatalog, source: str) -> None:
    if not found.gpus:
        raise fail(source, None, "no GPU (<pci> of class 0x03xxxx) in the topology")

    def key(item: tuple[XmlNode, XmlNode | None, str]) -> tuple[int, str]:
        pci, gpu, _ = item
        dev = gpu.attrs.get("dev") if gpu is not None else None
        return (int(dev) if dev and dev.isdigit() else 1 << 20, pci.attrs["busid"])

    items = sorted(found.gpus, key=key)
    names: list[str] = []
    for pci, _, _ in items:
        vendor, device = _hex(pci, "vendor", source), _hex(pci, "device", source)
        spec = gpu_spec_by_pci_id(vendor, device) if vendor is not None and device is not None else None
        known_ids = vendor is not None and device is not None
        names.append(spec.model if spec else (f"unknown PCI {vendor:#06x}:{device:#06x}" if known_ids else ""))
    known_names = tuple(names) if all(names) else ()
    specs = GpuCatalog(known_names, catalog.model).apply(d, len(items), source)
    bus_to_gpu: dict[str, str] = {}
    for i, ((pci, _, parent), spec) in enumerate(zip(items, specs, strict=True)):
        name = f"gpu{i}"
        d.add(Device(name, DeviceKind.GPU, 0, spec.model, spec.mem_bw_gbps, spec.mem_gb, spec.p2p))
        bw, gen, width = _link_of(pci, found, source)
        d.connect(name, parent, LinkKind.PCIE, bw, generation=gen, width=width)
        bus = pci.attrs["busid"].lower()
        if bus in bus_to_gpu:
            raise fail(source, pci.line, f"GPU busid {bus} repeats")
        bus_to_gpu[bus] = name
    if all(gpu is None for _, gpu, _ in items):
        d.warnings.append(f"{source}: no <gpu> elements (a hand-written NCCL_TOPO_FILE?): NVLink/NVSwitch "
                          "connectivity is not described, so GPUs are joined over PCIe only; "
                          "probe with --from-nvidia-smi for NVLink")
        return
    _nvlinks(d, items, specs, bus_to_gpu, source)


def _nvlinks(d, items, specs, bus_to_gpu, source) -> None:  # noqa: ANN001
    to_switch: dict[str, int] = {}
    pairs: dict[tuple[str, str], int] = {}
    chips: set[str] = set()
    switch_links: set[tuple[str, str]] = set()
    gen = None
    for i, (_, gpu, _) in enumerate(items):
        if gpu is None:
            continue
        name = f"gpu{i}"
        sm = gpu.attrs.get("sm", "")
        g = specs[i].fabric_gen or (nvlink_gen_by_sm(int(sm)) if sm.isdigit() else None)
        gen = gen or g
        for link in (c for c in gpu.children if c.tag == "nvlink"):
            target = link.attrs.get("target", "").lower()
            count_text = link.attrs.get("count", "")
            if not target or not count_text.isdigit() or int(count_text) < 1:
                raise fail(source, link.line, f"<nvlink> needs a target and a count >= 1, got {link.attrs}")
            count = int(count_text)
            tclass = link.attrs.get("tclass", "")
            tcls = int(tclass, 16) if re.fullmatch(r"0x[0-9a-fA-F]+", tclass) else None
            if target in bus_to_gpu:
                peer = bus_to_gpu[target]
                key = (name, peer)
                if key in pairs:
                    raise fail(source, link.line, f"{name} lists NVLinks to {target} twice")
                pairs[key] = count
            elif tcls is not None and tcls >> 8 == 0x0680:
                if (name, target) in switch_links:
                    raise fail(source, link.line, f"{name} lists NVLinks to {target} twice")
                switch_links.add((name, target))
                chips.add(target)
                to_switch[name] = to_switch.get(name, 0) + count
            else:
                d.warnings.append(f"{source}:{link.line}: NVLink from {name} to {target} (class {tclass or '?'}) "
                                  "is neither a GPU nor an NVSwitch: ignored")
    per_link = NVLINK_PER_LINK_GBPS.get(gen or 0, 25.0)
    if gen is None:
        d.note("NVLink generation unknown (no sm, no GPU model): 25 GB/s per link assumed")
    else:
        d.note(f"NVLink {gen}: {per_link:g} GB/s per link per direction (docs/hardware.md)")
    if to_switch:
        d.add(Device("nvswitch", DeviceKind.NVSWITCH, 0))
        for gpu_name, count in to_switch.items():
            d.connect(gpu_name, "nvswitch", LinkKind.NVLINK, count * per_link, count=count, generation=gen,
                      latency_us=NVSWITCH_LINK_LATENCY_US)
        counts = sorted(set(to_switch.values()))
        d.summary.append(f"NVSwitch ({len(chips)} chips merged; {'/'.join(map(str, counts))} NVLinks per GPU)")
    done = set()
    for (a, b), count in sorted(pairs.items()):
        if (b, a) in done:
            continue
        back = pairs.get((b, a))
        if back is not None and back != count:
            d.warnings.append(f"{source}: {a}->{b} lists {count} NVLinks but {b}->{a} lists {back}; using the fewer")
            count = min(count, back)
        d.connect(a, b, LinkKind.NVLINK, count * per_link, count=count, generation=gen)
        done.add((a, b))
    if done:
        d.summary.append(f"direct NVLink on {len(done)} GPU pair(s)")


def _ports(element: XmlNode, nets: list[XmlNode]) -> list[list[XmlNode | None]]:
    """The network devices of one adapter's ``<net>`` ports. NCCL (2.20.3 and later,
    ``NCCL_IB_MERGE_NICS`` on by default: ``net_ib.cc`` ``ncclIbFindMatchingDev``) merges the
    Active ports of one PCI device that share a GUID and link layer into one device at their
    summed speed; here the ports of one ``<pci>`` adapter with one GUID are merged (a file
    states no port's state; NCCL caps a device at 2 ports through 2.23, 4 from 2.24.3, not
    modelled). Ports without a GUID, and the ``<net>``s of a ``<nic>`` directly under a CPU
    (where NCCL collects devices that are not one adapter), stay apart. An adapter without
    ports is one device."""
    if not nets:
        return [[None]]
    guids = [net.attrs.get("guid", "") for net in nets]
    if element.tag != "pci" or not all(guids):
        return [[net] for net in nets]
    groups: dict[str, list[XmlNode | None]] = {}
    for net, guid in zip(nets, guids, strict=True):
        groups.setdefault(guid, []).append(net)
    return list(groups.values())


def _nics(d: NodeDraft, found: _Found, source: str) -> None:
    k = 0
    merged: list[str] = []
    # Unnamed NICs (hand-written files) are numbered in PCI bus order.
    order = sorted(found.nics, key=lambda item: (bool(item[1]), item[0].attrs.get("busid", "")))
    for element, nets, parent, layer in order:
        if element.tag == "pci":
            bw, gen, width = _link_of(element, found, source)
        else:
            bw, gen, width = pcie_bw_gbps(4), 4, 16
            d.note(f"NIC on line {element.line} sits on its CPU directly: Gen4 x16 assumed")
        for ports in _ports(element, nets):
            names, rates = [], []
            for net in ports:
                name = net.attrs.get("name") if net is not None else None
                names.append(name or f"nic{k}")
                k += 1
                if net is not None and "speed" in net.attrs:
                    speed = net.attrs["speed"]
                    if not speed.isdigit():
                        raise fail(source, net.line, f"<net name={names[-1]!r}> speed={speed!r} is not a number (Mb/s)")
                    rates.append(int(speed) / 1000.0)
            name = "+".join(names)
            if name in d.devices:
                raise fail(source, (ports[0] or element).line, f"NIC {name!r} repeats")
            # A port without a speed leaves the device's rate unknown (--nic-gbps gives it).
            rate = sum(rates) if len(rates) == len(ports) and sum(rates) > 0 else None
            if len(ports) > 1:
                merged.append(name)
            d.add(Device(name, DeviceKind.NIC, 0))
            # NCCL 2.20+ dumps a merged device as one <net name="mlx5_0+mlx5_1"> at the summed speed.
            d.nics[name] = NicInfo(rate_gbps=rate, link_layer=layer or None, state=None,
                                   ports=tuple(name.split("+")) if "+" in name else ())
            d.connect(name, parent, LinkKind.PCIE, bw, generation=gen, width=width)
    if merged:
        d.note(f"ports of one NIC merged into one device at their summed rate, as NCCL 2.20.3 and later does "
               f"(NCCL_IB_MERGE_NICS): {', '.join(merged)}")
    if found.nics:
        rates = sorted({i.rate_gbps for i in d.nics.values() if i.rate_gbps})
        text = f" at {'/'.join(f'{r:g}' for r in rates)} Gb/s" if rates else " (rate not given)"
        d.summary.append(f"{len(d.nics)} NIC{'' if len(d.nics) == 1 else 's'}{text}")
    else:
        d.summary.append("no NICs")
