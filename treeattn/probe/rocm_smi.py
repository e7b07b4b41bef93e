"""``rocm-smi --showtopo``: AMD GPU x GPU weight, hop and link-type matrices, NUMA nodes.

Sections are framed by ``=== Title ===`` lines. Read: ``Weight between two GPUs``,
``Hops between two GPUs``, ``Link Type between two GPUs`` (``XGMI``/``PCIE``; the diagonal
is ``0``) and ``Numa Nodes`` (``GPU[i] : (Topology) Numa Node: n``). Other sections and
the banner/WARNING lines are skipped. The link-type matrix is required; weights and hops,
when present, must have the same GPUs and be symmetric.

Model (``rocm_to_draft``): a ``XGMI`` pair one hop apart is one direct xGMI link at 64 GB/s
(docs/hardware.md MI300X row; RCCL models 48 GB/s per link on gfx94x, same file); every GPU
hangs off the CPU of its NUMA node over PCIe; CPUs are joined by socket links.
``rocm-smi --showtopo`` names no NICs (see ``ibstat``) and no GPU model (see ``--gpu-model``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from treeattn.probe.build import NodeDraft
from treeattn.probe.gpus import GpuCatalog
from treeattn.probe.hardware import XGMI_PER_LINK_GBPS, pcie_bw_gbps, socket_link
from treeattn.probe.text import fail
from treeattn.topology.model import Device, DeviceKind, LinkKind

__all__ = ["RocmTopo", "parse_rocm_showtopo", "rocm_to_draft"]

_TITLE = re.compile(r"^=+\s*(.*?)\s*=+$")
_NUMA = re.compile(r"^GPU\[(\d+)\]\s*:\s*\(Topology\)\s*Numa (Node|Affinity):\s*(-?\d+)\s*$")
_MATRICES = {
    "Weight between two GPUs": "weight",
    "Hops between two GPUs": "hops",
    "Link Type between two GPUs": "type",
}


@dataclass(frozen=True)
class RocmTopo:
    """Matrices by GPU index; the diagonal is left out."""

    gpus: int
    link_type: dict[tuple[int, int], str]
    hops: dict[tuple[int, int], int] = field(default_factory=dict)
    weight: dict[tuple[int, int], int] = field(default_factory=dict)
    numa: dict[int, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def parse_rocm_showtopo(text: str, source: str = "rocm-smi --showtopo") -> RocmTopo:
    """Read ``rocm-smi --showtopo`` output.

    Args:
        text: the command's output.
        source: file name for messages.

    Returns:
        The matrices and NUMA nodes.

    Raises:
        ProbeError: no link-type matrix, a ragged/truncated/asymmetric matrix, an unknown
            link type, matrices of different sizes, or an unreadable NUMA line.
    """
    lines = text.splitlines()
    sections: list[tuple[str, int, list[tuple[int, str]]]] = []
    for i, raw in enumerate(lines, 1):
        m = _TITLE.match(raw.strip())
        if m and raw.strip().startswith("==="):
            sections.append((m.group(1), i, []))
        elif sections and raw.strip():
            sections[-1][2].append((i, raw))
    mats: dict[str, tuple[dict[tuple[int, int], str], int, int]] = {}
    numa: dict[int, int] = {}
    for title, at, body in sections:
        key = _MATRICES.get(title)
        if key:
            if key in mats:
                raise fail(source, at, f"section {title!r} appears twice")
            mats[key] = (*_matrix(body, title, at, source), at)
        elif title == "Numa Nodes":
            for lineno, raw in body:
                m = _NUMA.match(raw.strip())
                if not m:
                    raise fail(source, lineno, f"unreadable NUMA line {raw.strip()!r}")
                if m.group(2) == "Node":
                    numa[int(m.group(1))] = int(m.group(3))
    if "type" not in mats:
        raise fail(source, None, "no 'Link Type between two GPUs' section: not `rocm-smi --showtopo` output?")
    types, n, type_at = mats["type"]
    for _cells, size, at in mats.values():
        if size != n:
            raise fail(source, at, f"this matrix is {size}x{size} but the link-type matrix (line {type_at}) is {n}x{n}")
    link_type: dict[tuple[int, int], str] = {}
    for (a, b), v in types.items():
        if v not in ("XGMI", "PCIE"):
            raise fail(source, type_at, f"GPU{a}-GPU{b}: unknown link type {v!r} (known: XGMI, PCIE)")
        link_type[(a, b)] = v
    ints: dict[str, dict[tuple[int, int], int]] = {}
    for key in ("hops", "weight"):
        if key in mats:
            cells, _, at = mats[key]
            try:
                ints[key] = {k: int(v) for k, v in cells.items()}
            except ValueError:
                raise fail(source, at, f"{key} matrix holds a value that is not a whole number") from None
    warnings: list[str] = []
    bad = [g for g in numa if not 0 <= g < n]
    if bad:
        raise fail(source, None, f"NUMA lines name GPU(s) {bad} outside 0..{n - 1}")
    if len(numa) < n:
        warnings.append(f"{source}: NUMA node missing for GPU(s) {[g for g in range(n) if g not in numa]}")
    return RocmTopo(n, link_type, ints.get("hops", {}), ints.get("weight", {}), numa, tuple(warnings))


def _matrix(body: list[tuple[int, str]], title: str, at: int, source: str) -> tuple[dict[tuple[int, int], str], int]:
    if not body:
        raise fail(source, at, f"section {title!r} is empty")
    head_no, head = body[0]
    cols = head.split()
    if cols != [f"GPU{i}" for i in range(len(cols))] or not cols:
        raise fail(source, head_no, f"{title}: header {head.strip()!r} is not GPU0 .. GPUn in order")
    n = len(cols)
    rows = body[1:]
    if len(rows) != n:
        raise fail(source, rows[-1][0] if rows else head_no, f"{title}: {len(rows)} rows for {n} GPUs: truncated?")
    cells: dict[tuple[int, int], str] = {}
    for r, (lineno, raw) in enumerate(rows):
        parts = raw.split()
        if parts[0] != f"GPU{r}":
            raise fail(source, lineno, f"{title}: expected row GPU{r}, got {parts[0]!r}")
        if len(parts) != n + 1:
            raise fail(source, lineno, f"{title}: row GPU{r} has {len(parts) - 1} cells, expected {n}")
        for c, v in enumerate(parts[1:]):
            if r == c:
                if v != "0":
                    raise fail(source, lineno, f"{title}: diagonal cell GPU{r}-GPU{c} is {v!r}, expected 0")
                continue
            cells[(r, c)] = v
    for (r, c), v in cells.items():
        if cells[(c, r)] != v:
            raise fail(source, rows[r][0], f"{title}: GPU{r}-GPU{c} is {v} but GPU{c}-GPU{r} is {cells[(c, r)]}")
    return cells, n


def rocm_to_draft(t: RocmTopo, catalog: GpuCatalog, *, cpu_vendor: str = "", source: str = "rocm-smi") -> NodeDraft:
    """Devices and links of one AMD machine (see the module docstring for the model).

    Args:
        t: the parsed output.
        catalog: GPU models (``--gpu-model``); unknown models get placeholders and a warning.
        cpu_vendor: for the socket link figures; unknown gives a default (noted).
        source: input name for messages.

    Returns:
        The draft.
    """
    d = NodeDraft()
    d.warnings.extend(t.warnings)
    specs = catalog.apply(d, t.gpus, source)
    numa = {g: t.numa.get(g, min(t.numa.values(), default=0)) for g in range(t.gpus)}
    nodes = sorted(set(numa.values()))
    for node in nodes:
        d.add(Device(f"cpu{node}", DeviceKind.CPU, 0))
    gen = max(s.pcie_gen for s in specs)
    bw = pcie_bw_gbps(gen, 16)
    d.note(f"PCIe links assumed Gen{gen} x16 = {bw:g} GB/s (rocm-smi --showtopo does not print them)")
    for g in range(t.gpus):
        s = specs[g]
        d.add(Device(f"gpu{g}", DeviceKind.GPU, 0, s.model, s.mem_bw_gbps, s.mem_gb, s.p2p))
        d.connect(f"gpu{g}", f"cpu{numa[g]}", LinkKind.PCIE, bw, generation=gen, width=16)
    per_link = next((s.per_link_gbps for s in specs if s.fabric_gen == 0), XGMI_PER_LINK_GBPS)
    d.cite("docs/hardware.md: xGMI 64 GB/s per link (RCCL models 48 GB/s on gfx94x)")
    direct, far = 0, []
    for a in range(t.gpus):
        for b in range(a + 1, t.gpus):
            if t.link_type[(a, b)] != "XGMI":
                continue
            hops = t.hops.get((a, b), 1)
            if hops != 1:
                far.append(f"GPU{a}-GPU{b} ({hops} hops)")
                continue
            d.connect(f"gpu{a}", f"gpu{b}", LinkKind.XGMI, per_link, count=1)
            direct += 1
    if far:
        d.warnings.append(f"{source}: XGMI pairs more than one hop apart use PCIe in this model: {', '.join(far)}")
    d.name_cpus(cpu_vendor)
    kind, sbw, label = socket_link(cpu_vendor, None)
    if len(nodes) > 1:
        d.note(f"socket links between NUMA nodes {nodes}: {label}")
        for i, a in enumerate(nodes):
            for b in nodes[i + 1:]:
                d.connect(f"cpu{a}", f"cpu{b}", kind, sbw)
    pairs = t.gpus * (t.gpus - 1) // 2
    mesh = "full xGMI mesh" if direct == pairs and pairs else f"xGMI on {direct} of {pairs} GPU pairs"
    d.summary.append(f"{mesh} ({per_link:g} GB/s per link)")
    d.summary.append(f"{len(nodes)} NUMA node(s)")
    return d
