"""Build a Topology from the compact form (a node template times a count, plus a network).

Device names: ``n{i}.cpu{s}``, ``n{i}.pcie{j}``, ``n{i}.gpu{g}``, ``n{i}.nvswitch`` (or
``nvl{d}.nvswitch`` for an NVLink domain spanning several nodes), ``n{i}.nic{k}``; leaves
``rail{k}.leaf{j}`` (rail-optimized) or ``leaf{j}`` (fat-tree); spines ``spine{j}``.
Every link is full duplex (two directed links). Ranks: every GPU, node by node.

Errors raise ``FieldError`` with the field path; the file loader adds file and line.
"""

from __future__ import annotations

import itertools
import math

from treeattn.errors import TopologyError
from treeattn.topology.model import (
    CostParams,
    Device,
    DeviceKind,
    Link,
    LinkKind,
    Topology,
    check_device_count,
    check_link_count,
    check_rank_count,
)
from treeattn.topology.schema import (
    CompactFile,
    CostSpec,
    FabricKind,
    FieldError,
    Loc,
    NetworkTopology,
)

__all__ = ["build_compact", "cost_params"]


def cost_params(spec: CostSpec) -> CostParams:
    return CostParams.from_flat(**spec.model_dump())


class _Builder:
    def __init__(self) -> None:
        self.devices: list[Device] = []
        self.links: list[Link] = []

    def dev(self, name: str, kind: DeviceKind, node: int, **kw: object) -> str:
        self.devices.append(Device(name=name, kind=kind, node=node, **kw))
        return name

    def duplex(self, a: str, b: str, kind: LinkKind, bw_gbps: float, latency_us: float, **kw: object) -> None:
        self.links.append(Link(a, b, kind, bw_gbps, latency_us, **kw))
        self.links.append(Link(b, a, kind, bw_gbps, latency_us, **kw))


def _nic_of_gpu(spec: CompactFile) -> tuple[list[int | None], list[list[int]]]:
    """For each GPU the NIC index serving it (None: nearest), and each NIC's GPU list.

    A GPU sends through one NIC (``Device.nic``; routing and NCCL's model alike), so a NIC
    that serves no GPU would carry nothing while the network still gave it a leaf port:
    refused, as is a GPU listed under two NICs (the second would be ignored)."""
    n_gpu = spec.node.gpus.count
    nics = spec.node.nics
    if nics is None:
        return [None] * n_gpu, []
    if nics.gpus is None:
        if nics.count > n_gpu:
            raise FieldError(
                ("node", "nics", "count"),
                f"{nics.count} NICs for {n_gpu} GPUs: a GPU sends through one NIC here, so "
                f"{nics.count - n_gpu} would carry nothing; give count: {n_gpu} with bw_gbps the total of "
                "a GPU's NICs (docs/topology-format.md, 'NICs')",
            )
        served = [[] for _ in range(nics.count)]
        for g in range(n_gpu):  # one pass: a scan of every GPU per NIC is 16,384 x 16,384 steps at the limit
            served[g * nics.count // n_gpu].append(g)
    else:
        if len(nics.gpus) != nics.count:
            raise FieldError(
                ("node", "nics", "gpus"), f"lists {len(nics.gpus)} NICs but node.nics.count is {nics.count}"
            )
        served = nics.gpus
    owner: list[int | None] = [None] * n_gpu
    for k, gpus in enumerate(served):
        if not gpus:
            raise FieldError(("node", "nics", "gpus", k), f"NIC {k} serves no GPU, so it would carry nothing; "
                             "leave it out (a GPU sends through one NIC)")
        for j, g in enumerate(gpus):
            if not 0 <= g < n_gpu:
                raise FieldError(("node", "nics", "gpus", k, j), f"GPU {g} does not exist (node has {n_gpu})")
            if owner[g] is not None:
                raise FieldError(("node", "nics", "gpus", k, j), f"GPU {g} is already served by NIC {owner[g]}; "
                                 "a GPU sends through one NIC")
            owner[g] = k
    return owner, served


def build_compact(spec: CompactFile) -> Topology:
    """Build the topology a compact-form spec describes.

    Args:
        spec: the validated compact form.

    Returns:
        The Topology (not yet checked for routability).
    """
    _check(spec)
    owner, served = _nic_of_gpu(spec)
    b = _Builder()
    ranks: list[str] = []
    for i in range(spec.nodes):
        ranks.extend(_node(b, spec, i, owner, served))
    if spec.network is not None:
        _network(b, spec)
    try:
        return Topology(
            name=spec.name, devices=b.devices, links=b.links, ranks=ranks, description=spec.description,
            sources=spec.sources, cost=cost_params(spec.cost),
        )
    except TopologyError as exc:
        raise FieldError((), str(exc)) from None


def _check(spec: CompactFile) -> None:
    """What pydantic cannot see: fields that depend on each other."""
    node, fabric = spec.node, spec.node.fabric
    n_gpu = node.gpus.count
    try:  # before anything is built: a million GPUs would take minutes and gigabytes first
        check_rank_count(spec.nodes * n_gpu, f"{spec.nodes:,} nodes of {n_gpu} GPUs")
    except TopologyError as exc:
        raise FieldError(("nodes",), str(exc)) from None
    _check_size(spec)
    if node.pcie.switches > n_gpu:  # the GPUs are spread over the switches: the rest would hold nothing
        raise FieldError(("node", "pcie", "switches"), f"{node.pcie.switches} PCIe switches for {n_gpu} GPUs: "
                         f"{node.pcie.switches - n_gpu} would hold no GPU (GPUs are spread evenly over the switches); "
                         f"give at most {n_gpu}")
    # kind defaults to none: a fabric written without it (`{bw_gbps: 450, count: 18}`) would
    # silently be a PCIe-only node, its NVLink figures dropped.
    ignored = sorted(fabric.model_fields_set - {"kind"}) if fabric.kind is FabricKind.NONE else []
    if ignored:
        raise FieldError(("node", "fabric", ignored[0]), "given, but fabric.kind is none (PCIe only), which "
                         "reads no other field; set kind: nvswitch, full-mesh or pairs")
    if fabric.kind is not FabricKind.NONE and fabric.bw_gbps is None:
        raise FieldError(("node", "fabric", "bw_gbps"), f"a {fabric.kind.value} fabric needs bw_gbps")
    if (fabric.kind is FabricKind.PAIRS) != (fabric.pairs is not None):
        raise FieldError(("node", "fabric", "pairs"), "pairs are given exactly when kind is pairs")
    per_domain = fabric.nodes_per_domain
    if per_domain > 1 and fabric.kind is not FabricKind.NVSWITCH:
        raise FieldError(("node", "fabric", "nodes_per_domain"), "only an nvswitch fabric spans several nodes")
    if spec.nodes % per_domain:
        raise FieldError(("nodes",), f"{spec.nodes} nodes do not fill NVLink domains of {per_domain} nodes")
    if spec.network is not None and node.nics is None:
        raise FieldError(("network",), "a network needs node.nics to attach to")
    if spec.nodes > 1 and (node.nics is None or spec.network is None):
        raise FieldError(("nodes",), f"{spec.nodes} nodes need node.nics and a network section to reach each other")
    seen: set[tuple[int, int]] = set()
    for p, (a, b, lanes) in enumerate(fabric.pairs or ()):
        if not (0 <= a < n_gpu and 0 <= b < n_gpu) or a == b:
            raise FieldError(("node", "fabric", "pairs", p), f"[{a}, {b}] must name two GPUs in 0..{n_gpu - 1}")
        if lanes < 1:
            raise FieldError(("node", "fabric", "pairs", p, 2), f"lanes must be >= 1, got {lanes}")
        if (min(a, b), max(a, b)) in seen:
            raise FieldError(("node", "fabric", "pairs", p), f"pair [{a}, {b}] is listed twice")
        seen.add((min(a, b), max(a, b)))


def _network_shape(spec: CompactFile) -> tuple[int, int, int]:
    """Leaves, the most NICs on one leaf, and spines, as ``_network`` builds them."""
    net, nodes = spec.network, spec.nodes
    n_nic = spec.node.nics.count if spec.node.nics is not None else 0
    if net is None or n_nic == 0:
        return 0, 0, 0
    per_leaf = net.nics_per_leaf
    if net.topology is NetworkTopology.RAIL_OPTIMIZED:
        leaves, fullest = n_nic * -(-nodes // per_leaf), min(per_leaf, nodes)
    else:
        leaves, fullest = -(-nodes * n_nic // per_leaf), min(per_leaf, nodes * n_nic)
    spines = net.spines
    if spines is None:
        spines = 0 if leaves == 1 else math.ceil(fullest / net.oversubscription)
    return leaves, fullest, spines


def _size_parts(spec: CompactFile) -> list[tuple[Loc, str, int, int]]:
    """The devices and directed links ``build_compact`` makes, counted without building
    them, by the field that asks for them: ``(field, the field in words, devices, links)``."""
    node, fabric, nodes = spec.node, spec.node.fabric, spec.nodes
    n_gpu, n_cpu, n_sw = node.gpus.count, node.cpus.count, node.pcie.switches
    n_nic = node.nics.count if node.nics is not None else 0
    leaves, _, spines = _network_shape(spec)
    in_nodes = f"in {nodes:,} node{'s' if nodes != 1 else ''}"
    leaf_words = f"{leaves:,} leaf switch{'es' if leaves != 1 else ''}"
    switches = 0
    if fabric.kind is FabricKind.NVSWITCH:
        switches = nodes // fabric.nodes_per_domain
    if fabric.kind is FabricKind.FULL_MESH:
        fabric_links, mesh = n_gpu * (n_gpu - 1), " in a full mesh"
    elif fabric.kind is FabricKind.PAIRS:
        fabric_links, mesh = 2 * len(fabric.pairs or ()), ""
    else:
        fabric_links, mesh = 2 * n_gpu if fabric.kind is FabricKind.NVSWITCH else 0, ""
    socket_links = n_cpu * (n_cpu - 1) if node.cpus.link is not None else 0
    return [
        (("nodes",), f"{nodes:,} nodes", switches, 0),
        (("node", "cpus", "count"), f"{n_cpu:,} CPU sockets per node {in_nodes}", nodes * n_cpu,
         nodes * socket_links),
        (("node", "pcie", "switches"), f"{n_sw:,} PCIe switches per node {in_nodes}", nodes * n_sw, nodes * 2 * n_sw),
        (("node", "gpus", "count"), f"{n_gpu:,} GPUs per node{mesh} {in_nodes}", nodes * n_gpu,
         nodes * (2 * n_gpu + fabric_links)),
        (("node", "nics", "count"), f"{n_nic:,} NICs per node {in_nodes}", nodes * n_nic,
         nodes * n_nic * (4 if spec.network is not None else 2)),
        (("network", "nics_per_leaf"), leaf_words, leaves, 0),
        (("network", "spines"), f"{spines:,} spine switches over {leaf_words}", spines,
         2 * leaves * spines),
    ]


def _check_size(spec: CompactFile) -> None:
    """Refuse a spec that makes more devices or links than the limits before building any
    (building ``pcie.switches: 1000000000`` would take minutes and gigabytes first), naming
    the field that adds the most."""
    parts = _size_parts(spec)
    for i, check in ((2, check_device_count), (3, check_link_count)):
        total = sum(part[i] for part in parts)
        loc, words = max(parts, key=lambda part: part[i])[:2]
        try:
            check(total, words)
        except TopologyError as exc:
            raise FieldError(loc, str(exc)) from None


def _node(b: _Builder, spec: CompactFile, i: int, owner: list[int | None], served: list[list[int]]) -> list[str]:
    """Add node ``i`` (sockets, PCIe tree, GPUs, GPU fabric, NICs); returns its GPUs."""
    node, pcie = spec.node, spec.node.pcie
    n_gpu, n_cpu, n_sw = node.gpus.count, node.cpus.count, pcie.switches
    pcie_kw = {"generation": pcie.generation, "width": pcie.width}
    p = f"n{i}."
    cpus = [b.dev(f"{p}cpu{s}", DeviceKind.CPU, i, model=node.cpus.model) for s in range(n_cpu)]
    if node.cpus.link is not None:
        sl = node.cpus.link
        for s in range(n_cpu):
            for t in range(s + 1, n_cpu):
                b.duplex(cpus[s], cpus[t], sl.kind, sl.bw_gbps, sl.latency_us)
    switches = []
    for j in range(n_sw):
        sw = b.dev(f"{p}pcie{j}", DeviceKind.PCIE_SWITCH, i)
        b.duplex(sw, cpus[j * n_cpu // n_sw], LinkKind.PCIE, pcie.bw_gbps, pcie.latency_us, **pcie_kw)
        switches.append(sw)
    parents = switches or cpus
    gpu_parent = [parents[g * len(parents) // n_gpu] for g in range(n_gpu)]
    gpus = []
    hl = node.gpus.host_link
    for g in range(n_gpu):
        gpu = b.dev(
            f"{p}gpu{g}", DeviceKind.GPU, i, model=node.gpus.model, mem_bw_gbps=node.gpus.mem_bw_gbps,
            mem_gb=node.gpus.mem_gb, p2p=node.gpus.p2p, nic="" if owner[g] is None else f"{p}nic{owner[g]}",
        )
        if hl is None:
            b.duplex(gpu, gpu_parent[g], LinkKind.PCIE, pcie.bw_gbps, pcie.latency_us, **pcie_kw)
        else:
            b.duplex(gpu, gpu_parent[g], hl.kind, hl.bw_gbps, hl.latency_us, generation=hl.generation, width=hl.width)
        gpus.append(gpu)
    _gpu_fabric(b, spec, i, gpus)
    if node.nics is not None:
        for k in range(node.nics.count):
            nic = b.dev(f"{p}nic{k}", DeviceKind.NIC, i, model=node.nics.model)
            parent = gpu_parent[served[k][0]]  # every NIC serves a GPU (_nic_of_gpu)
            b.duplex(nic, parent, LinkKind.PCIE, pcie.bw_gbps, pcie.latency_us, **pcie_kw)
    return gpus


def _gpu_fabric(b: _Builder, spec: CompactFile, i: int, gpus: list[str]) -> None:
    fabric = spec.node.fabric
    kind = fabric.link or (LinkKind.XGMI if fabric.kind is FabricKind.FULL_MESH else LinkKind.NVLINK)
    kw = {"generation": fabric.generation}
    if fabric.kind is FabricKind.NVSWITCH:
        per_domain = fabric.nodes_per_domain
        if per_domain == 1:
            nvs = b.dev(f"n{i}.nvswitch", DeviceKind.NVSWITCH, i)
        else:
            nvs = f"nvl{i // per_domain}.nvswitch"
            if i % per_domain == 0:
                b.dev(nvs, DeviceKind.NVSWITCH, -1)
        for gpu in gpus:
            b.duplex(gpu, nvs, kind, fabric.bw_gbps, fabric.latency_us, count=fabric.count, **kw)
    elif fabric.kind is FabricKind.FULL_MESH:
        for g, h in itertools.combinations(range(len(gpus)), 2):
            b.duplex(gpus[g], gpus[h], kind, fabric.bw_gbps, fabric.latency_us, count=fabric.count, **kw)
    elif fabric.kind is FabricKind.PAIRS:
        for x, y, lanes in fabric.pairs:
            b.duplex(gpus[x], gpus[y], kind, fabric.bw_gbps * lanes, fabric.latency_us, count=lanes, **kw)


def _network(b: _Builder, spec: CompactFile) -> None:
    net, nics = spec.network, spec.node.nics
    per_leaf = net.nics_per_leaf
    leaves: dict[str, list[str]] = {}
    if net.topology is NetworkTopology.RAIL_OPTIMIZED:
        for k in range(nics.count):
            for i in range(spec.nodes):
                leaves.setdefault(f"rail{k}.leaf{i // per_leaf}", []).append(f"n{i}.nic{k}")
    else:
        for i in range(spec.nodes):
            for k in range(nics.count):
                g = i * nics.count + k
                leaves.setdefault(f"leaf{g // per_leaf}", []).append(f"n{i}.nic{k}")
    fullest = max(len(v) for v in leaves.values())
    spines = _network_shape(spec)[2]
    if len(leaves) > 1 and spines == 0:
        raise FieldError(
            ("network", "spines"), f"{len(leaves)} leaf switches need at least one spine to reach each other"
        )
    lat = net.switch_latency_us
    for leaf, members in leaves.items():
        b.dev(leaf, DeviceKind.SWITCH, -1, tier="leaf")
        for nic in members:
            b.duplex(nic, leaf, net.kind, nics.bw_gbps, lat)
    # Uplinks are sized by the fullest leaf so that every leaf gets the same ports.
    up_gbps = fullest * nics.bw_gbps / net.oversubscription / max(spines, 1)
    for j in range(spines):
        spine = b.dev(f"spine{j}", DeviceKind.SWITCH, -1, tier="spine")
        for leaf in leaves:
            b.duplex(leaf, spine, net.kind, up_gbps, lat)
