"""Values a topology file may hold in the wrong unit: valid numbers no hardware has.

A file's figures are GB/s, GB and microseconds. The same hardware written in Gb/s, MiB or
nanoseconds passes every field check and is planned on without a word: a 400 Gb/s port
written ``bw_gbps: 400`` is eight times any port's speed. ``implausible`` names such values
so that the commands that load a topology can warn; nothing is refused, since an exotic or
future part may hold them.
"""

from __future__ import annotations

from treeattn.topology.model import DeviceKind, LinkClass, LinkKind, Topology

__all__ = ["implausible", "LINK_MIN_GBPS", "NETWORK_PORT_MAX_GBPS", "GPU_MEM_MAX_GB", "GPU_MEM_BW_MAX_GBPS",
           "GPU_MEM_BW_MIN_GBPS", "GPU_MEM_MIN_GB", "HOP_MAX_US", "CALL_MAX_US", "ATTN_OVER_MEMORY",
           "SWITCH_HOP_MAX_US", "NIC_OVER_PCIE", "NVLINK_PER_LINK_GBPS", "NVLINK_LANE_MIN_GBPS", "NVLINK_MAX_GBPS",
           "XGMI_PER_LINK_GBPS",
           "PCIE_MAX_GBPS"]

LINK_MIN_GBPS = 1e-6
"""A link under 1 kB/s (a 56k modem moves 7): a time on it is days; emulated links run at
0.0125 GB/s (100 Mbit/s) and up."""
NETWORK_PORT_MAX_GBPS = 200.0
"""A network port above 1.6 Tb/s (InfiniBand XDR, 1.6T Ethernet): none ships faster."""
GPU_MEM_MAX_GB = 1024.0
"""A GPU with more than 1 TB of its own memory (the largest, B300 and MI355X, hold 288 GB)."""
GPU_MEM_MIN_GB = 1.0
"""A GPU with under 1 GiB of its own memory (the smallest sold in a decade, a GT 1030, holds 2 GB;
H100's 80 GB written in TB is 0.08)."""
GPU_MEM_BW_MAX_GBPS = 20000.0
"""A GPU's memory above 20 TB/s (B200/B300: 8 TB/s)."""
GPU_MEM_BW_MIN_GBPS = 10.0
"""A GPU's memory under 10 GB/s: the slowest GPU memory sold (a GT 1030 with DDR4) moves 16.8
GB/s, and every data-centre GPU's figure in TB/s (H100 3.35, B200 8) is under 10: a figure in
TB/s written as GB/s."""
NIC_OVER_PCIE = 2.0
"""A NIC's port above twice its PCIe link: the port cannot move more than reaches it (a 400 Gb/s
NIC, 50 GB/s, sits on PCIe 5.0 x16, about 55): more is a port written in Gb/s."""
PCIE_MAX_GBPS = 128.0
"""A PCIe link above 128 GB/s one way: PCIe 6.0 x16, the fastest sold, moves 128 (64 GT/s x 16
lanes); PCIe 5.0 x16 written in Gb/s as lanes times transfer rate gives 512."""
NVLINK_PER_LINK_GBPS: dict[int, float] = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
"""One NVLink, one direction, by generation (docs/hardware.md NVLink 3/4/5 rows; NVLink 2 from the
V100 datasheet; NVLink 1 from P100's: 4 links, 80 GB/s one way). NVIDIA's own figures count both
directions: H100's 900 GB/s is 18 links of 25."""
NVLINK_LANE_MIN_GBPS: dict[int | None, float] = {1: 20.0, 2: 25.0, 3: 14.0625, 4: 25.0, 5: 50.0, None: 14.0625}
"""The slowest NVLink lane of each generation, one direction (NVLink 3's is the GA102 bridge's: A40 and
RTX 3090, 4 links of 14.0625; the rest as ``NVLINK_PER_LINK_GBPS``), and of any (None)."""
XGMI_PER_LINK_GBPS = 64.0
"""One xGMI link between two MI300X (or MI325X), one direction (docs/hardware.md xGMI row); AMD's 128
GB/s counts both directions, and a GPU's 7 links of a full mesh of 8 move 448."""
NVLINK_MAX_GBPS = 900.0
"""A GPU's NVLinks above 900 GB/s one way: the fastest, NVLink 5 (B200, GB200), is 18 links of 50;
NVIDIA's 1.8 TB/s for it counts both directions."""
HOP_MAX_US = {LinkClass.GPU_FABRIC: 100.0, LinkClass.PCIE: 100.0, LinkClass.NETWORK: 1000.0}
"""A link's latency above 100 us inside a node (NVLink and PCIe: about 1 us) or 1 ms between
nodes (a switch hop: under 1 us; a long-haul link a few hundred)."""
CALL_MAX_US = 10000.0
"""A fixed cost per message or kernel (``cost.overhead_us``, ``launch_us``, ``attn_launch_us``,
``attn_next_launch_us``) above 10 ms: a GPU kernel launches in about 5 us and the slowest host
figures here (gloo in an emulated cluster) are a few hundred, so more is nanoseconds written as
microseconds."""
ATTN_OVER_MEMORY = 1.5
"""A measured attention kernel (``cost.attn_gbps``) this many times faster than its GPUs' memory:
it streams the KV from there, so no run reaches 1; up to 1.5, a calibration's line over sizes
near the L2 cache (50 MB on H100) may, so more is a figure in another unit."""
SWITCH_HOP_MAX_US = 100.0
"""A port's link to its switch (a NIC's, a host's) above 100 us: a switch hop takes under 1 us
(InfiniBand about 0.1-0.6, Ethernet a few; a software network of kernel sockets, as the emulated
clusters', tens), so more is nanoseconds written as microseconds (``network.switch_latency_us``)."""


def implausible(topo: Topology) -> list[str]:
    """One line per kind of value ``topo`` holds beyond any hardware (module docstring), naming
    the first device or link that holds it and how many more do; empty where none."""
    found: dict[str, list[str]] = {}
    nics = {d.name for d in topo.devices if d.kind is DeviceKind.NIC}
    switches = {d.name for d in topo.devices if d.kind is DeviceKind.SWITCH}
    # a network port's own cable to its switch: a NIC's, a host's, a GPU with its own port's
    ports = {d.name for d in topo.devices if d.kind is not DeviceKind.SWITCH}
    for d in topo.devices:
        if d.kind is not DeviceKind.GPU:
            continue
        if d.mem_gb > GPU_MEM_MAX_GB:
            found.setdefault("mem_gb", []).append(
                f"GPU {d.name} has mem_gb {d.mem_gb:g}, more than any GPU's memory; mem_gb is GiB (MiB / 1024)")
        if 0 < d.mem_gb < GPU_MEM_MIN_GB:
            found.setdefault("slow mem_gb", []).append(
                f"GPU {d.name} has mem_gb {d.mem_gb:g}, less than any GPU's memory; mem_gb is GiB: {d.mem_gb:g} TiB is "
                f"{d.mem_gb * 1024:g}")
        if d.mem_bw_gbps > GPU_MEM_BW_MAX_GBPS:
            found.setdefault("mem_bw_gbps", []).append(
                f"GPU {d.name} has mem_bw_gbps {d.mem_bw_gbps:g}, faster than any GPU's memory; mem_bw_gbps is GB/s")
        if 0 < d.mem_bw_gbps < GPU_MEM_BW_MIN_GBPS:
            found.setdefault("slow mem_bw_gbps", []).append(
                f"GPU {d.name} has mem_bw_gbps {d.mem_bw_gbps:g}, slower than any GPU's memory (16.8 GB/s the "
                f"slowest); mem_bw_gbps is GB/s: {d.mem_bw_gbps:g} TB/s is {d.mem_bw_gbps * 1000:g}")
    seen: set[tuple] = set()
    for ln in topo.links:
        pair = (frozenset((ln.src, ln.dst)), ln.kind, ln.bw_gbps, ln.latency_us)
        if pair in seen:  # a duplex link's other direction: one line of the file
            continue
        seen.add(pair)
        what = f"link {ln.src}->{ln.dst} ({ln.kind.value})"
        if ln.cls is LinkClass.NETWORK and ln.bw_gbps > NETWORK_PORT_MAX_GBPS:
            found.setdefault("bw_gbps", []).append(
                f"{what} has bw_gbps {ln.bw_gbps:g}, faster than any network port (1.6 Tb/s is 200 GB/s); "
                f"bw_gbps is GB/s: {ln.bw_gbps:g} Gb/s is {ln.bw_gbps / 8:g}")
        # A calibrated link's hardware figure is its rating; what calibrate fitted, it warned of then.
        field, gbps = ("rated_gbps", ln.rated_gbps) if ln.rated_gbps is not None else ("bw_gbps", ln.bw_gbps)
        if ln.kind is LinkKind.PCIE and gbps > 1.05 * PCIE_MAX_GBPS:
            found.setdefault("pcie bw_gbps", []).append(
                f"{what} has {field} {gbps:g}, faster than any PCIe link (6.0 x16 moves {PCIE_MAX_GBPS:g} GB/s one "
                f"way); {field} is GB/s: {gbps:g} Gb/s is {gbps / 8:g}")
        if ln.bw_gbps < LINK_MIN_GBPS:
            found.setdefault("slow bw_gbps", []).append(
                f"{what} has bw_gbps {ln.bw_gbps:g}, slower than any link ({LINK_MIN_GBPS:g} is 1 kB/s); bw_gbps is "
                "GB/s")
        if ln.kind is LinkKind.NVLINK:
            nvlink = _nvlink_over(gbps, ln.count, ln.generation, field)
            if nvlink:
                found.setdefault("nvlink", []).append(f"{what} has {field} {gbps:g}, {nvlink}")
            floor = NVLINK_LANE_MIN_GBPS.get(ln.generation, NVLINK_LANE_MIN_GBPS[None])
            if gbps / ln.count < 0.75 * floor:
                known = ln.generation is not None and ln.generation in NVLINK_LANE_MIN_GBPS
                lanes = f"NVLink {ln.generation} lane" if known else "NVLink lane"
                found.setdefault("slow nvlink", []).append(
                    f"{what} has {field} {gbps:g} over {ln.count} link(s), {gbps / ln.count:.3g} a link, less than "
                    f"any {lanes} moves ({floor:g}); {field} is all its links together, one direction (18 NVLink 4 "
                    "links: 450), and count the links, not both directions")
        vendor = _fabric_vendor(topo, ln)
        if vendor:
            found.setdefault("vendor", []).append(f"{what}: {vendor}")
        if ln.kind is LinkKind.XGMI and gbps > 1.25 * XGMI_PER_LINK_GBPS * ln.count:
            ratio = gbps / (XGMI_PER_LINK_GBPS * ln.count)
            why = (f"; {field} is one direction: AMD's figures count both" if abs(ratio - 2) < 0.2 else
                   f"; {field} is one GPU pair's, not a GPU's links together (or give count, the links joining "
                   "the pair: MI250X's two dies, 4)" if ratio > 2.5 else "")
            links = (f"one xGMI link moves one way ({XGMI_PER_LINK_GBPS:g} on MI300X)" if ln.count == 1 else
                     f"its {ln.count} xGMI links move one way ({XGMI_PER_LINK_GBPS * ln.count:g}, "
                     f"{XGMI_PER_LINK_GBPS:g} each on MI300X)")
            found.setdefault("xgmi", []).append(f"{what} has {field} {gbps:g}, more than {links}{why}")
        limit = HOP_MAX_US.get(ln.cls)
        if ln.cls is LinkClass.NETWORK and {ln.src, ln.dst} & ports and {ln.src, ln.dst} & switches:
            if ln.latency_us > SWITCH_HOP_MAX_US:
                found.setdefault("switch hop latency_us", []).append(
                    f"{what} has latency_us {ln.latency_us:g}, over {SWITCH_HOP_MAX_US:g} us for a port's hop to its "
                    "switch (under 1 us in hardware); latency_us is microseconds (ns / 1000)")
            limit = None
        if limit is not None and ln.latency_us > limit:
            found.setdefault(f"latency_us {ln.cls.value}", []).append(
                f"{what} has latency_us {ln.latency_us:g}, over {limit:g} us for a {ln.cls.value} hop; latency_us is "
                "microseconds (ns / 1000)")
    pcie: dict[str, float] = {}
    port: dict[str, float] = {}
    for ln in topo.links:
        if ln.src in nics:
            into = pcie if ln.cls is LinkClass.PCIE else port if ln.cls is LinkClass.NETWORK else None
            if into is not None:
                into[ln.src] = max(into.get(ln.src, 0.0), ln.bw_gbps)
    for nic, gbps in port.items():
        if nic in pcie and NIC_OVER_PCIE * pcie[nic] < gbps <= NETWORK_PORT_MAX_GBPS:  # above: said already
            found.setdefault("nic over pcie", []).append(
                f"NIC {nic} has bw_gbps {gbps:g} on the network but {pcie[nic]:g} over its PCIe link; bw_gbps is "
                f"GB/s: {gbps:g} Gb/s is {gbps / 8:g}")
    for text in _cost(topo):
        found.setdefault(text, []).append(text)
    return [first + (f" (and {len(rest)} more)" if rest else "") for first, *rest in found.values()]


def _cost(topo: Topology) -> list[str]:
    """The ``cost`` figures beyond any hardware: a fixed cost per call over ``CALL_MAX_US``, and
    an attention kernel measured ``ATTN_OVER_MEMORY`` times faster than its GPUs' memory (it reads
    the KV from there) or slower than any GPU's memory."""
    c, out = topo.cost, []
    for key in ("overhead_us", "launch_us", "attn_launch_us", "attn_next_launch_us"):
        value = getattr(c, key)
        if value is not None and value > CALL_MAX_US:
            out.append(f"cost.{key} {value:g} is over {CALL_MAX_US / 1000:g} ms a call (a GPU kernel launches in about "
                       f"5 us); {key} is microseconds (ns / 1000)")
    gpus = [topo.rank_device(r) for r in range(topo.num_ranks)]
    if c.attn_gbps is None or not gpus or any(d.kind is not DeviceKind.GPU for d in gpus):
        return out
    slowest = min(d.mem_bw_gbps for d in gpus)
    if 0 < slowest and c.attn_gbps > ATTN_OVER_MEMORY * slowest:
        out.append(f"cost.attn_gbps {c.attn_gbps:g} is over {ATTN_OVER_MEMORY:g} x the GPUs' memory bandwidth "
                   f"(mem_bw_gbps {slowest:g}), which the attention kernel reads the KV from; attn_gbps is GB/s")
    elif c.attn_gbps < GPU_MEM_BW_MIN_GBPS:
        out.append(f"cost.attn_gbps {c.attn_gbps:g} is slower than any GPU's memory (16.8 GB/s the slowest); "
                   f"attn_gbps is GB/s: {c.attn_gbps:g} TB/s is {c.attn_gbps * 1000:g}")
    return out


_AMD_GPU = ("MI",)
_NVIDIA_GPU = ("NVIDIA", "TESLA", "GEFORCE", "QUADRO", "RTX", "A100", "A800", "A10", "A30", "A40", "H100", "H200",
               "H800", "H20", "GH200", "B100", "B200", "B300", "GB200", "GB300", "L40", "L4", "L20", "V100", "T4")


def _vendor(model: str) -> str | None:
    name = model.upper().strip()
    return "AMD" if name.startswith(_AMD_GPU) else "NVIDIA" if name.startswith(_NVIDIA_GPU) else None


def _fabric_vendor(topo: Topology, ln) -> str:  # noqa: ANN001 - a Link
    """Why an NVLink between AMD GPUs or an xGMI link between NVIDIA GPUs is another vendor's
    link, or "": NCCL's figures and library (NCCL or RCCL) follow the link kind, so MI300X
    joined by nvlink was timed as NCCL on NVLink."""
    want = {LinkKind.NVLINK: "NVIDIA", LinkKind.XGMI: "AMD"}.get(ln.kind)
    ends = [topo.device(n) for n in (ln.src, ln.dst)]
    vendors = {_vendor(d.model) for d in ends if d.kind is DeviceKind.GPU}
    if want is None or len(vendors) != 1 or None in vendors or want in vendors:
        return ""
    (vendor,) = vendors
    other = "xgmi" if vendor == "AMD" else "nvlink"
    return f"{ln.kind.value} is {want}'s link, and {ends[0].model} is {vendor}'s: its GPUs talk over {other}"


def _nvlink_over(gbps: float, count: int, generation: int | None, field: str) -> str:
    """Why ``gbps`` one way (the link's ``field``) is more than ``count`` NVLinks of ``generation``
    (or any GPU's NVLinks) move, or "". A file's figures are one direction; NVIDIA's count both."""
    per = NVLINK_PER_LINK_GBPS.get(generation or 0)
    if per and count > 1:  # the links' own figure decides: a trunk of more than 18 may exceed any GPU's
        one_way = count * per
        if gbps <= 1.05 * one_way:
            return ""
        both = f"; {field} is one direction: {one_way * 2:g} GB/s counts both" if abs(gbps / one_way - 2) < 0.1 else ""
        return f"more than its {count} NVLink {generation} links move one way ({one_way:g}, {per:g} each){both}"
    if generation is not None and generation > max(NVLINK_PER_LINK_GBPS):
        return ""  # a generation after NVLink 5: faster than any this module knows of
    if gbps > 1.05 * NVLINK_MAX_GBPS:
        return (f"more than any GPU's NVLinks move one way ({NVLINK_MAX_GBPS:g}, NVLink 5); {field} is one direction: "
                f"NVIDIA's figures count both")
    return ""
