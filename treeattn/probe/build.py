"""Assemble what the parsers found into a Topology: one machine, then N of them on a fabric.

Every parser fills a ``NodeDraft`` with node-local names (``gpu0``, ``cpu1``, ``mlx5_0``,
``pcie2``, ``nvswitch``); ``finish`` prefixes them ``n<i>.``, places one rank per GPU,
chooses each GPU's NIC, and joins the nodes through NICs and network switches.

Two lists travel with the result and are always shown to the user: ``warnings`` (the input
was damaged, partial or self-contradictory: what was done about it) and ``assumptions``
(figures the tool output does not contain, filled in from datasheets; ``calibrate``
replaces them).
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field
from enum import StrEnum

from treeattn.errors import ProbeError
from treeattn.probe.hardware import LATENCY_US, SOURCE_HARDWARE, pcie_bw_gbps
from treeattn.topology.attention_fits import published_attention_fit
from treeattn.topology.compact import cost_params
from treeattn.topology.model import (
    CostParams,
    Device,
    DeviceKind,
    Link,
    LinkClass,
    LinkKind,
    Topology,
    check_rank_count,
)

__all__ = ["NicInfo", "NodeDraft", "Fabric", "ProbeResult", "finish", "attach_near_gpu", "add_assumed_nics"]


@dataclass
class NicInfo:
    """A network adapter port as the tools describe it."""

    rate_gbps: float | None = None
    """Line rate in Gb/s (bits), as ibstat prints it; None when unknown."""
    link_layer: str | None = None
    """``InfiniBand`` or ``Ethernet`` (an RDMA NIC on Ethernet is RoCE); None when unknown."""
    state: str | None = None
    """``Active``, ``Down``, ...; None when unknown."""
    model: str = ""
    rdma: bool = True
    """False for a plain Ethernet NIC (TCP, no RoCE)."""
    ports: tuple[str, ...] = ()
    """The port devices merged into this one (``mlx5_0``, ``mlx5_1``: an adapter's ports, as
    NCCL merges them), or empty: the NIC is one port device, its own name."""

    def rate_of_ports(self, port_gbps: float) -> float:
        """The device's line rate where each of its ports runs at ``port_gbps`` (``--nic-gbps``
        and ``--nics`` give a port's rate)."""
        return port_gbps * max(1, len(self.ports))


@dataclass
class NodeDraft:
    """One machine being assembled (mutable; parsers only add to it)."""

    devices: dict[str, Device] = field(default_factory=dict)
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)
    """GPU device names in rank order."""
    nics: dict[str, NicInfo] = field(default_factory=dict)
    """NIC device name -> what is known of its port."""
    gpu_nic: dict[str, str] = field(default_factory=dict)
    """GPU -> NIC chosen by the parser (else ``finish`` picks the nearest)."""
    warnings: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=lambda: [SOURCE_HARDWARE])
    summary: list[str] = field(default_factory=list)
    """Phrases for the description (``8x H100-SXM5-80GB``, ``NVSwitch``, ...)."""
    rates_from: str = ""
    """The ibstat output the NICs' rates were read from (``apply_ibstat``), if any."""

    def add(self, device: Device) -> None:
        if device.name in self.devices:
            raise ProbeError(f"internal: device {device.name!r} added twice")
        self.devices[device.name] = device
        if device.kind is DeviceKind.GPU:
            self.gpus.append(device.name)
        if device.kind is DeviceKind.NIC:
            self.nics.setdefault(device.name, NicInfo(model=device.model))

    def name_cpus(self, vendor: str) -> None:
        """Give the CPU sockets their vendor (``AMD``/``Intel``, from ``GenuineIntel``,
        ``AuthenticAMD``, ``intel``, ``amd``) as their model, as NCCL reads it: the cost model
        takes NCCL's per-vendor choices from it (``treeattn.cost.nccl_rates.cpu_vendor``); an
        unknown vendor leaves them unnamed."""
        v = (vendor or "").lower()
        label = "AMD" if "amd" in v else "Intel" if "intel" in v else ""
        if not label:
            return
        for name, dev in list(self.devices.items()):
            if dev.kind is DeviceKind.CPU and not dev.model:
                self.devices[name] = dataclasses.replace(dev, model=label)

    def connect(
        self,
        a: str,
        b: str,
        kind: LinkKind,
        bw_gbps: float,
        *,
        count: int = 1,
        generation: int | None = None,
        width: int | None = None,
        latency_us: float | None = None,
    ) -> None:
        """Add the full-duplex link a <-> b (two directed links, same figures; latency by kind
        unless given)."""
        lat = LATENCY_US[kind] if latency_us is None else latency_us
        for src, dst in ((a, b), (b, a)):
            if (src, dst) in self.links:
                raise ProbeError(f"internal: link {src}->{dst} added twice")
            self.links[(src, dst)] = Link(src, dst, kind, float(bw_gbps), lat, count, generation, width)

    def pcie_parent(self, name: str) -> str | None:
        """The first device ``name`` reaches over a PCIe-class link (its bridge or CPU)."""
        for (src, dst), ln in self.links.items():
            if src == name and ln.cls is LinkClass.PCIE:
                return dst
        return None

    def note(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    def cite(self, text: str) -> None:
        if text and text not in self.sources:
            self.sources.append(text)


def _line_rate(gbit: float) -> str:
    """A NIC's line rate as the flags give it (Gb/s) beside what the topology file holds (GB/s):
    ``--nics 8x50`` is 6.25 GB/s a port, not 50."""
    return f"{gbit:g} Gb/s ({gbit / 8:g} GB/s, the file's bw_gbps)"


def attach_near_gpu(draft: NodeDraft, nic: str, k: int, count: int) -> None:
    """Connect NIC ``k`` of ``count`` to the PCIe parent of GPU ``k * gpus // count`` and make
    it the NIC of that GPU group (for inputs that do not say where NICs sit)."""
    gpus = draft.gpus
    g = gpus[k * len(gpus) // count] if gpus else None
    parent = draft.pcie_parent(g) if g else None
    if parent is None:
        parent = next((n for n, dv in draft.devices.items() if dv.kind is DeviceKind.CPU), None)
    if parent is None:
        raise ProbeError(f"internal: nowhere to attach NIC {nic!r}")
    link = draft.links.get((g, parent)) if g else None
    bw, gen, width = (link.bw_gbps, link.generation, link.width) if link else (pcie_bw_gbps(4), 4, 16)
    draft.connect(nic, parent, LinkKind.PCIE, bw, generation=gen, width=width)
    for i, gpu in enumerate(gpus):
        if i * count // len(gpus) == k:
            draft.gpu_nic[gpu] = nic


def add_assumed_nics(draft: NodeDraft, count: int, rate_gbps: float | None) -> None:
    """``--nics COUNT[xGBIT]``: add NICs the inputs do not show, NIC k beside GPU k*GPUs/COUNT.

    When the draft already has NICs, nothing is added (the data wins; a warning says so if
    the counts differ) but their unknown rates take ``rate_gbps``.
    """
    if count < 1:
        raise ProbeError(f"--nics count must be >= 1, got {count}")
    if rate_gbps is not None and rate_gbps <= 0:
        raise ProbeError(f"--nics rate must be > 0 Gb/s, got {rate_gbps}")
    if draft.nics:
        if len(draft.nics) != count:
            draft.warnings.append(f"--nics {count} ignored: the input shows {len(draft.nics)} NICs")
        # A rate the input gives wins too; said, so that 8x400 over an input's 200 is not silently dropped.
        kept = sorted({info.rate_gbps for info in draft.nics.values() if info.rate_gbps is not None})
        if rate_gbps is not None and any(r != rate_gbps for r in kept):
            draft.warnings.append(f"--nics rate {rate_gbps:g} Gb/s ignored where the input gives one "
                                  f"({'/'.join(f'{r:g}' for r in kept)} Gb/s); edit the written file to change it")
        for info in draft.nics.values():
            if info.rate_gbps is None and rate_gbps is not None:
                info.rate_gbps = info.rate_of_ports(rate_gbps)
        return
    for k in range(count):
        name = f"nic{k}"
        draft.add(Device(name, DeviceKind.NIC, 0))
        draft.nics[name] = NicInfo(rate_gbps=rate_gbps)
        attach_near_gpu(draft, name, k, count)
    rate = f" at {_line_rate(rate_gbps)}" if rate_gbps else ""
    draft.note(f"{count} NICs{rate} from --nics, NIC k beside GPU k*GPUs/NICs (placement assumed)")
    draft.summary.append(f"{count} NICs (from --nics)")


class Fabric(StrEnum):
    """How ``--nodes`` joins machines: ``rail`` gives NIC k of every node its own leaf switch
    (rail-optimized, leaves joined by one spine); ``single`` puts every NIC on one switch."""

    RAIL = "rail"
    SINGLE = "single"


class LinkLayer(StrEnum):
    """``--link-layer``: what the NICs run on where the inputs do not say (ibstat's ``Link
    layer``): InfiniBand, or Ethernet with RDMA (RoCE)."""

    INFINIBAND = "infiniband"
    ROCE = "roce"


def assume_link_layer(draft: NodeDraft, layer: LinkLayer) -> None:
    """Give the NICs whose link layer the inputs do not say ``layer`` (``--link-layer``), noted."""
    infiniband = layer is LinkLayer.INFINIBAND
    unknown = [n for n, info in draft.nics.items() if info.rdma and info.link_layer is None]
    for n in unknown:
        draft.nics[n].link_layer = "InfiniBand" if infiniband else "Ethernet"  # as ibstat prints them
    if unknown:
        draft.note(f"link layer {'InfiniBand' if infiniband else 'RoCE'} from --link-layer for {', '.join(unknown)}")


@dataclass(frozen=True)
class ProbeResult:
    """A probed topology and what the user must know about it."""

    topology: Topology
    warnings: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()
    source: str = ""
    """What was read (tool and file), e.g. ``nvidia-smi topo -m (dgx.txt)``."""

    def to_dict(self) -> dict:
        return {
            "topology": self.topology.to_dict(),
            "warnings": list(self.warnings),
            "assumptions": list(self.assumptions),
            "source": self.source,
        }


def _path_cost(draft: NodeDraft, start: str) -> dict[str, tuple[int, int]]:
    """(CPUs crossed, hops) from ``start`` to every device over PCIe-class links, passing
    only through bridges and CPUs: a PCIe switch shared beats any path through a CPU."""
    best: dict[str, tuple[int, int]] = {start: (0, 0)}
    heap = [((0, 0), start)]
    out: dict[str, list[str]] = {}
    for (src, dst), ln in draft.links.items():
        if ln.cls is LinkClass.PCIE:
            out.setdefault(src, []).append(dst)
    while heap:
        cost, u = heapq.heappop(heap)
        if cost > best.get(u, cost):
            continue
        if u != start and draft.devices[u].kind not in (DeviceKind.PCIE_SWITCH, DeviceKind.CPU):
            continue
        for v in sorted(out.get(u, ())):
            cpus = cost[0] + (1 if draft.devices[v].kind is DeviceKind.CPU else 0)
            nxt = (cpus, cost[1] + 1)
            if nxt < best.get(v, (1 << 30, 0)):
                best[v] = nxt
                heapq.heappush(heap, (nxt, v))
    return best


def _usable(info: NicInfo) -> bool:
    return (info.state or "Active").lower().startswith("active")


def _assign_nics(draft: NodeDraft) -> dict[str, str]:
    """GPU -> NIC: the nearest usable NIC, spreading GPUs over equally near NICs."""
    usable = [n for n, info in draft.nics.items() if _usable(info)]
    down = [n for n in draft.nics if n not in usable]
    if down:
        draft.warnings.append(f"NICs not Active, left unused: {', '.join(down)}")
    chosen = {g: n for g, n in draft.gpu_nic.items() if n in usable}
    if not usable:
        return chosen
    cost = {g: _path_cost(draft, g) for g in draft.gpus if g not in chosen}
    far = (1 << 30, 0)
    order = sorted(cost, key=lambda g: (min(cost[g].get(n, far) for n in usable), draft.gpus.index(g)))
    load = {n: sum(1 for v in chosen.values() if v == n) for n in usable}
    for g in order:
        pick = min(usable, key=lambda n: (cost[g].get(n, far), load[n], usable.index(n)))
        if cost[g].get(pick, far) == far:
            continue
        chosen[g] = pick
        load[pick] += 1
    return chosen


def _network_kind(info: NicInfo) -> LinkKind | None:
    if not info.rdma:
        return LinkKind.ETHERNET
    layer = (info.link_layer or "").lower()
    if layer.startswith("infiniband"):
        return LinkKind.INFINIBAND
    if layer.startswith("ethernet"):
        return LinkKind.ROCE
    return None


def finish(
    draft: NodeDraft,
    *,
    name: str,
    source: str,
    nodes: int = 1,
    nic_gbps: float | None = None,
    fabric: Fabric = Fabric.RAIL,
) -> ProbeResult:
    """Turn one machine's draft into a Topology of ``nodes`` identical machines.

    Args:
        draft: what the parsers found (node-local names).
        name: topology name.
        source: what was read, for the description and the result.
        nodes: machines to replicate the probed one into (>= 1).
        nic_gbps: NIC line rate in Gb/s for NICs whose rate the inputs do not give
            (and, when given, for all NICs whose rate is unknown).
        fabric: how nodes are joined (only used when ``nodes`` > 1).

    Returns:
        The topology (one rank per GPU, node-major), with warnings and assumptions.
    """
    if nodes < 1:
        raise ProbeError(f"--nodes must be >= 1, got {nodes}")
    if not draft.gpus:
        raise ProbeError(f"{source}: no GPU found; nothing to place ranks on")
    check_rank_count(nodes * len(draft.gpus), f"--nodes {nodes} x {len(draft.gpus)} GPUs")
    gpu_nic = _assign_nics(draft)
    fabric_nics: list[str] = []
    for g in draft.gpus:
        n = gpu_nic.get(g)
        if n and n not in fabric_nics:
            fabric_nics.append(n)
    idle = [n for n in draft.nics if n not in fabric_nics and _usable(draft.nics[n])]
    if idle and fabric_nics:
        draft.note(f"NICs nearest to no GPU (storage or management?) kept off the GPU fabric: {', '.join(idle)}")
    rates: dict[str, float] = {}
    from_flag: list[str] = []
    for n in fabric_nics:
        info = draft.nics[n]
        rate = info.rate_gbps if info.rate_gbps else None if nic_gbps is None else info.rate_of_ports(nic_gbps)
        if rate is None and nodes > 1:
            raise ProbeError(
                f"{source}: the line rate of NIC {n} is unknown; pass --nic-gbps (e.g. 400) or --ibstat FILE"
                if not draft.rates_from else
                f"{source}: the line rate of NIC {n} is unknown: {draft.rates_from} has no port for it (or its port is "
                "down); pass --nic-gbps (e.g. 400) for it, or ibstat output of a node whose ports are all up"
            )
        if rate is not None and rate <= 0:
            raise ProbeError(f"NIC {n}: line rate must be > 0 Gb/s, got {rate}")
        if rate is not None:
            rates[n] = rate
            if not info.rate_gbps:
                from_flag.append(n)
    if from_flag:
        merged = [n for n in from_flag if draft.nics[n].ports]
        per = f" a port ({', '.join(merged)}: one a port merged)" if merged else ""
        draft.note(f"NIC line rate {_line_rate(nic_gbps)}{per} from --nic-gbps for {', '.join(from_flag)}")
    if nodes > 1 and not fabric_nics:
        raise ProbeError(f"{source}: --nodes {nodes} needs NICs to join the nodes, but no GPU has a usable NIC; "
                         + _no_usable_nic(draft))

    def local(i: int, n: str) -> str:
        return f"n{i}.{n}"

    devices: list[Device] = []
    links: list[Link] = []
    ranks: list[str] = []
    for i in range(nodes):
        for d in draft.devices.values():
            nic = local(i, gpu_nic[d.name]) if d.name in gpu_nic else ""
            model = (draft.nics[d.name].model or d.model) if d.name in draft.nics else d.model
            devices.append(
                Device(local(i, d.name), d.kind, i, model, d.mem_bw_gbps, d.mem_gb, d.p2p, d.tier, nic)
            )
        for ln in draft.links.values():
            links.append(
                Link(local(i, ln.src), local(i, ln.dst), ln.kind, ln.bw_gbps, ln.latency_us,
                     ln.count, ln.generation, ln.width)
            )
        ranks.extend(local(i, g) for g in draft.gpus)

    fabric_text = ""
    if nodes > 1:
        fabric_text = _join_nodes(draft, nodes, fabric, fabric_nics, rates, devices, links, local)
    described = ", ".join(draft.summary)
    description = f"Probed from {source}: {described}" + (
        f"; x {nodes} nodes, {fabric_text}" if nodes > 1 else ""
    ) + ". Link figures are datasheet defaults until calibrated."
    topo = Topology(
        name=name,
        devices=tuple(devices),
        links=tuple(links),
        ranks=tuple(ranks),
        description=description,
        sources=tuple(draft.sources),
        cost=_attention_cost(draft),
    )
    topo.check_routable()
    return ProbeResult(topo, tuple(draft.warnings), tuple(draft.assumptions), source)


def _no_usable_nic(draft: NodeDraft) -> str:
    """What to do where no GPU has a usable NIC: ``--nics`` adds NICs only to an input that
    shows none (``add_assumed_nics``), so it is offered only there."""
    if not draft.nics:
        return "pass --nics COUNTxGBIT or --ibstat FILE"
    down = [f"{n} {draft.nics[n].state}" for n in draft.nics if not _usable(draft.nics[n])]
    if len(down) == len(draft.nics):
        return (f"none of its NICs is Active ({', '.join(down)}), and --nics adds NICs only where the input shows "
                "none: probe from ibstat output of a node whose ports are up")
    return (f"its NICs ({', '.join(draft.nics)}) reach no GPU over PCIe, and --nics adds NICs only where the input "
            "shows none")


def _attention_cost(draft: NodeDraft) -> CostParams:
    """The published decode-kernel fit of the node's GPU model (all GPUs one model), noted
    as an assumption; else the defaults (``launch_us``, ``mem_efficiency``)."""
    models = {draft.devices[g].model for g in draft.gpus}
    fit = published_attention_fit(models.pop()) if len(models) == 1 else None
    if fit is None:
        return CostParams()
    which, spec = fit
    draft.note(f"attention kernel: the fit to published decode kernels on {which} (cost.attn_launch_us "
               f"{spec.attn_launch_us:g}, cost.attn_efficiency {spec.attn_efficiency:g}; docs/attention-model.md)")
    return cost_params(spec)


def _join_nodes(draft, nodes, fabric, fabric_nics, rates, devices, links, local) -> str:  # noqa: ANN001
    kinds = {n: _network_kind(draft.nics[n]) or LinkKind.INFINIBAND for n in fabric_nics}
    unknown = [n for n in fabric_nics if _network_kind(draft.nics[n]) is None]
    if unknown:
        draft.note(f"link layer unknown, InfiniBand assumed, for {', '.join(unknown)}: for RoCE pass --link-layer "
                   "roce, or --ibstat FILE (ibstat prints a RoCE port's 'Link layer: Ethernet')")
    kind_set = sorted({k.value for k in kinds.values()})

    def duplex(a: str, b: str, kind: LinkKind, bw: float, count: int = 1) -> None:
        for s, d in ((a, b), (b, a)):
            links.append(Link(s, d, kind, bw, LATENCY_US[kind], count))

    top = max(rates[n] for n in fabric_nics) / 8.0
    if fabric is Fabric.SINGLE or len(fabric_nics) == 1:
        devices.append(Device("leaf0", DeviceKind.SWITCH, -1, tier="leaf"))
        for i in range(nodes):
            for n in fabric_nics:
                duplex(local(i, n), "leaf0", kinds[n], rates[n] / 8.0)
        return f"{len(fabric_nics)} NIC(s) each on one {'/'.join(kind_set)} switch"
    kind0 = kinds[fabric_nics[0]]
    devices.append(Device("spine0", DeviceKind.SWITCH, -1, tier="spine"))
    for r, n in enumerate(fabric_nics):
        leaf = f"rail{r}"
        devices.append(Device(leaf, DeviceKind.SWITCH, -1, tier="leaf"))
        for i in range(nodes):
            duplex(local(i, n), leaf, kinds[n], rates[n] / 8.0)
        # Non-blocking: a leaf's uplink carries all its nodes at full rate.
        duplex(leaf, "spine0", kind0, top * nodes, count=nodes)
    rate_text = "/".join(f"{v:g}" for v in sorted({rates[n] for n in fabric_nics}))
    return (
        f"rail-optimized {'/'.join(kind_set)} fabric: {len(fabric_nics)} rails of {rate_text} Gb/s NICs, "
        "one leaf per rail, leaves joined by a non-blocking spine"
    )
