"""``nvidia-smi topo -m``: the GPU x GPU and GPU x NIC connection matrix.

Legend (docs/hardware.md, "nvidia-smi topo -m legend"): ``X`` self, ``NV#`` # bonded NVLinks,
``PIX`` at most one PCIe bridge, ``PXB`` several bridges without the host bridge, ``PHB``
through the host bridge (the CPU), ``NODE`` across host bridges inside one NUMA node,
``SYS`` across NUMA nodes (``SOC`` in old versions). Trailing columns: ``CPU Affinity``,
``NUMA Affinity``, ``GPU NUMA ID`` (each optional). Cells are tab-separated as printed; a
copy whose tabs became spaces is read by its 8-column tab stops, and one whose spacing was
lost by whitespace, with a warning for any row whose trailing values could sit under more
than one of those columns (none is read there).

``parse_topo_matrix`` reads the text into a ``TopoMatrix`` (no guessing); ``topo_to_draft``
turns that into devices and links (see its docstring for what is inferred and how).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from treeattn.probe.build import NodeDraft
from treeattn.probe.gpus import GpuCatalog
from treeattn.probe.hardware import NVSWITCH_LINK_LATENCY_US, pcie_bw_gbps, socket_link
from treeattn.probe.nvlink_status import NvlinkStatus
from treeattn.probe.text import fail
from treeattn.topology.model import Device, DeviceKind, LinkKind

__all__ = ["TopoMatrix", "parse_topo_matrix", "topo_to_draft", "PCIE_CODES"]

PCIE_CODES = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""PCIe relations, nearest first."""
_TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_NAME = re.compile(r"^[A-Za-z][\w.:-]*$")


@dataclass(frozen=True)
class TopoMatrix:
    """The matrix as printed, keyed by column names (``GPU0``, ``NIC0``, ``mlx5_0``)."""

    columns: tuple[str, ...]
    rel: dict[tuple[str, str], str]
    """(a, b) -> ``NV12``/``PIX``/.../``SYS`` for a != b (``SOC`` read as ``SYS``)."""
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa: dict[str, int] = field(default_factory=dict)
    """NUMA Affinity of GPU rows that print one."""
    nic_names: dict[str, str] = field(default_factory=dict)
    """``NIC0`` -> ``mlx5_0`` from the NIC Legend."""
    warnings: tuple[str, ...] = ()

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if c.startswith("GPU"))

    @property
    def nics(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if not c.startswith("GPU"))


# A header token: one of the multi-word column names, else a run of non-blanks. Their words
# are one space apart, as are some columns (`mlx5_10 CPU Affinity` once tabs are expanded).
_TOKEN = re.compile("|".join(re.escape(t) for t in _TRAILING) + r"|\S+")
_TAB = 8
"""Tab stops of a terminal: the spaces a copied capture has where nvidia-smi printed tabs."""


def _header_cells(line: str, tabbed: bool) -> list[str]:
    if tabbed:
        cells = [c.strip() for c in line.split("\t")]
        return cells[1:] if cells and cells[0] == "" else cells
    return _TOKEN.findall(line)


def _untab(line: str) -> list[str] | None:
    """The tab-separated cells of a line whose tabs were expanded to spaces (a capture copied
    from a terminal), or None when its cells do not sit on tab stops (spacing changed).

    nvidia-smi separates cells with tabs and pads some (an empty CPU Affinity, the gap
    before GPU NUMA ID) with further tabs: each tab stop between two cells is one tab, so
    the empty cells come back and every value keeps its column."""
    cells: list[str] = []
    end = 0
    for m in re.finditer(r"\S+", line):
        stop = m.start() // _TAB * _TAB
        if m.start() - stop > 1:  # cells start on a stop, " X " one after it
            return None
        if cells:  # an indent before the first cell is no cell
            tabs = stop // _TAB - end // _TAB
            if tabs < 1:
                return None
            cells.extend([""] * (tabs - 1))
        cells.append(m.group())
        end = m.end()
    return cells


def parse_topo_matrix(text: str, source: str = "nvidia-smi topo -m") -> TopoMatrix:
    """Read ``nvidia-smi topo -m`` output.

    Args:
        text: the command's output (lines before the header, such as a shell prompt, are skipped).
        source: file name for messages.

    Returns:
        The matrix. Missing GPU rows are tolerated when the other rows' columns give every
        relation (a warning says so).

    Raises:
        ProbeError: no header, a truncated or extra cell, an unknown code, a row label that
            is not a column, a relation that differs between its two cells, or an ``X`` off
            the diagonal; the message names the line.
    """
    lines = text.splitlines()
    if any("ROCm System Management Interface" in ln for ln in lines[:5]):  # its matrices name GPU0 too
        raise fail(source, None, "rocm-smi output, not `nvidia-smi topo -m`: give it with --from-rocm-smi")
    # The header names GPU0 and, unlike every row, holds no "X" cell.
    head = next((i for i, ln in enumerate(lines) if "GPU0" in ln.split() and "X" not in ln.split()), None)
    if head is None:
        raise fail(source, None, "no header line naming GPU0: not `nvidia-smi topo -m` output")
    tabbed = "\t" in lines[head]
    cells = _header_cells(lines[head], tabbed)
    columns: list[str] = []
    trailing: list[str] = []
    for c in cells:
        if c in _TRAILING:
            trailing.append(c)
        elif trailing:
            raise fail(source, head + 1, f"column {c!r} after {trailing[-1]!r}: header damaged")
        elif c == "" or not _NAME.match(c):
            raise fail(source, head + 1, f"bad column name {c!r} in the header")
        else:
            columns.append(c)
    if len(set(columns)) != len(columns):
        raise fail(source, head + 1, "a column name repeats in the header")
    gpu_cols = [c for c in columns if c.startswith("GPU")]
    if gpu_cols != [f"GPU{i}" for i in range(len(gpu_cols))]:
        raise fail(source, head + 1, f"GPU columns are not GPU0..GPU{len(gpu_cols) - 1} in order: {gpu_cols}")
    if columns[: len(gpu_cols)] != gpu_cols:
        raise fail(source, head + 1, "NIC columns come before GPU columns: header reordered")
    n = len(columns)

    rel: dict[tuple[str, str], tuple[str, int]] = {}
    affinity: dict[str, str] = {}
    numa: dict[str, int] = {}
    seen: dict[str, int] = {}
    warnings: list[str] = []
    i = head + 1
    while i < len(lines) and lines[i].strip() and not lines[i].strip().startswith("Legend"):
        lineno = i + 1
        # exact: every cell in its place, empty ones included (tabs, or tabs expanded to stops).
        row = lines[i].split("\t") if tabbed else _untab(lines[i])
        exact = row is not None
        if row is None:
            row = lines[i].split()
        label = row[0].strip()
        if label not in columns:
            raise fail(source, lineno, f"row label {label!r} is not a column of the header")
        if label in seen:
            raise fail(source, lineno, f"row {label} repeats (first on line {seen[label]})")
        seen[label] = lineno
        body = [c.strip() for c in row[1:]]
        if len(body) < n:
            raise fail(source, lineno, f"row {label} has {len(body)} of {n} matrix cells: truncated?")
        for col, cell in zip(columns, body[:n], strict=True):
            m = _CELL.match(cell)
            if not m:
                raise fail(
                    source, lineno,
                    f"row {label}, column {col}: unknown code {cell!r} (known: X, NV#, {', '.join(PCIE_CODES)})",
                )
            if (cell == "X") != (col == label):
                raise fail(source, lineno, f"row {label}, column {col}: {cell!r} where the diagonal is "
                           f"{'X' if col == label else 'not X'}: columns or rows reordered?")
            if cell == "X":
                continue
            code = "SYS" if cell == "SOC" else cell
            if code.startswith("NV") and not (label.startswith("GPU") and col.startswith("GPU")):
                raise fail(source, lineno, f"row {label}, column {col}: NVLink {cell} to a NIC")
            rel[(label, col)] = (code, lineno)
        extra = body[n:]
        if label.startswith("GPU"):
            _trailing(source, lineno, label, extra, trailing, exact, affinity, numa, warnings)
        elif any(extra):
            raise fail(source, lineno, f"row {label}: {len(extra)} cells after the matrix, expected none for a NIC")
        i += 1
    missing = [c for c in columns if c not in seen]
    if not seen:
        raise fail(source, head + 2, "no matrix rows after the header")
    out: dict[tuple[str, str], str] = {}
    for a in columns:
        for b in columns:
            if a == b:
                continue
            ab, ba = rel.get((a, b)), rel.get((b, a))
            if ab and ba and ab[0] != ba[0]:
                raise fail(source, ab[1], f"{a}-{b} is {ab[0]} but {b}-{a} is {ba[0]} on line {ba[1]}: "
                           "the matrix is not symmetric (damaged or reordered)")
            got = ab or ba
            if got is None:
                raise fail(source, None, f"no row gives the relation {a}-{b} (rows {', '.join(missing)} missing)")
            out[(a, b)] = got[0]
    if missing:
        warnings.append(f"{source}: rows {', '.join(missing)} missing; relations taken from the other rows"
                        + ("; their NUMA affinity is unknown" if any(m.startswith("GPU") for m in missing) else ""))
    nic_names = _nic_legend(lines, source)
    for nic in (c for c in columns if re.fullmatch(r"NIC\d+", c)):
        if nic not in nic_names:
            warnings.append(f"{source}: {nic} has no line in the NIC Legend; named {nic.lower()}")
    return TopoMatrix(tuple(columns), out, affinity, numa, nic_names, tuple(warnings))


def _trailing(source, lineno, label, extra, names, exact, affinity, numa, warnings) -> None:  # noqa: ANN001
    """Affinity cells of a GPU row. nvidia-smi pads with extra tabs before GPU NUMA ID, so
    rows whose cells keep their places (``exact``) map by position with the last name taking
    the last cell. Without their places, fewer values than names could belong to any of
    them (an empty CPU Affinity moves NUMA Affinity's value under it): none is read then."""
    values: dict[str, str] = {}
    if exact and len(extra) > len(names) and names:
        head, tail = extra[: len(names) - 1], extra[len(names) - 1:]
        if any(tail[:-1]):
            raise fail(source, lineno, f"row {label}: {len(extra)} cells after the matrix, expected {len(names)}")
        values = dict(zip(names, [*head, tail[-1]], strict=True))
    elif len(extra) > len(names):
        raise fail(source, lineno, f"row {label}: {len(extra)} cells after the matrix, expected {len(names)}")
    elif exact or len(extra) == len(names):
        values = dict(zip(names, extra, strict=False))
        if len(extra) < len(names):
            warnings.append(f"{source}:{lineno}: row {label} lacks {', '.join(names[len(extra):])}")
    else:
        warnings.append(f"{source}:{lineno}: row {label} has {len(extra)} value(s) {' '.join(extra)!r} for "
                        f"{', '.join(names)} and its spacing does not say which; none read (give the output "
                        "with its tabs)")
        return
    cpu = values.get("CPU Affinity", "")
    if cpu and cpu != "N/A":
        if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", cpu):
            raise fail(source, lineno, f"row {label}: CPU Affinity {cpu!r} is not a CPU list")
        affinity[label] = cpu
    node = values.get("NUMA Affinity", "")
    if node and node != "N/A":
        if not node.isdigit():
            raise fail(source, lineno, f"row {label}: NUMA Affinity {node!r} is not a number")
        numa[label] = int(node)


def _nic_legend(lines: list[str], source: str) -> dict[str, str]:
    out: dict[str, str] = {}
    start = next((i for i, ln in enumerate(lines) if ln.strip() == "NIC Legend:"), None)
    if start is None:
        return out
    for i in range(start + 1, len(lines)):
        s = lines[i].strip()
        if not s:
            continue
        m = re.fullmatch(r"(NIC\d+):\s*(\S+)", s)
        if not m:
            raise fail(source, i + 1, f"NIC Legend line {s!r} is not 'NICk: name'")
        out[m.group(1)] = m.group(2)
    return out


# -- matrix -> devices and links ---------------------------------------------------------------


def _groups(items: list[str], same) -> list[list[str]]:  # noqa: ANN001
    """Connected components of the relation ``same`` (union-find), in first-seen order."""
    parent = {x: x for x in items}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a in items:
        for b in items:
            if a < b and same(a, b):
                parent[find(b)] = find(a)
    comps: dict[str, list[str]] = {}
    for x in items:
        comps.setdefault(find(x), []).append(x)
    return list(comps.values())


def topo_to_draft(
    m: TopoMatrix,
    catalog: GpuCatalog,
    *,
    nvlink: NvlinkStatus | None = None,
    cpu_vendor: str = "",
    source: str = "nvidia-smi topo -m",
) -> NodeDraft:
    """Devices and links of one machine from its topo matrix.

    What is inferred, and how:

    * NVLink: if some GPU's NVLinks (sum of ``NV#`` over peers) exceed what one GPU of its
      generation has (12 for A100, 18 for H100; 18 when unknown), the GPUs meet in NVSwitches,
      modelled as one ``nvswitch`` device (the chips are merged: traffic is sprayed over all
      of them); each GPU gets its largest ``NV#`` as link count. Otherwise each ``NV#`` pair is
      a direct link of # NVLinks. Per-link GB/s from ``nvlink`` (``nvidia-smi nvlink --status``)
      when given, else by generation (docs/hardware.md).
    * PCIe: GPUs and NICs related by ``PIX`` share a switch; ``PXB`` groups hang under one
      upper switch (``PIX`` groups as leaf switches below it); everything else attaches to
      the CPU of its NUMA node (``PHB`` and ``NODE`` are not told apart). PCIe links are
      assumed x16 of the GPU's generation. GPU pairs joined by NVLink hide their PCIe
      relation; they are placed by their relations to NICs.
    * CPUs: one per NUMA node, from ``NUMA Affinity``, else from distinct ``CPU Affinity``
      lists, else from the components of non-``SYS`` relations; NICs take the node of their
      nearest GPU. Every pair of CPUs is joined by a socket link.

    Args:
        m: the parsed matrix.
        catalog: GPU models per index (from names, ``--gpu-model`` or unknown).
        nvlink: parsed ``nvidia-smi nvlink --status``, optional.
        cpu_vendor: ``intel``/``amd`` when known (socket link figures); else a default.
        source: input name for messages.

    Returns:
        The draft, with warnings for contradictions found and assumptions made.
    """
    d = NodeDraft()
    gpus, nics = list(m.gpus), list(m.nics)
    local = {c: f"gpu{c[3:]}" for c in gpus}
    for c in nics:
        local[c] = m.nic_names.get(c, c.lower() if re.fullmatch(r"NIC\d+", c) else c)
    d.warnings.extend(m.warnings)
    specs = catalog.apply(d, len(gpus), source)
    for idx, c in enumerate(gpus):
        spec = specs[idx]
        d.add(Device(local[c], DeviceKind.GPU, 0, spec.model, spec.mem_bw_gbps, spec.mem_gb, spec.p2p))
    for c in nics:
        d.add(Device(local[c], DeviceKind.NIC, 0))
    pcie_gen = max(s.pcie_gen for s in specs)
    pcie = pcie_bw_gbps(pcie_gen, 16)
    d.note(f"PCIe links assumed Gen{pcie_gen} x16 = {pcie:g} GB/s (topo -m does not print them)")

    _nvlinks(d, m, gpus, local, specs, nvlink, source)
    numa_of, guessed = _numa(d, m, gpus, nics, source)
    cpus = sorted(set(numa_of.values()))
    for node in cpus:
        d.add(Device(f"cpu{node}", DeviceKind.CPU, 0))
    d.name_cpus(cpu_vendor)
    kind, bw, label = socket_link(cpu_vendor, None)
    if len(cpus) > 1:
        d.note(f"socket links between NUMA nodes {cpus}: {label}")
        for a_i, a in enumerate(cpus):
            for b in cpus[a_i + 1:]:
                d.connect(f"cpu{a}", f"cpu{b}", kind, bw)

    ends = gpus + nics
    rel = m.rel

    def near(codes: tuple[str, ...]):  # noqa: ANN202
        return lambda a, b: rel[(a, b)] in codes

    n_sw = 0
    placed: set[str] = set()
    for comp in _groups(ends, near(("PIX", "PXB"))):
        if len(comp) < 2:
            continue
        cpu = f"cpu{numa_of[comp[0]]}"
        leaves = [g for g in _groups(comp, near(("PIX",))) if len(g) > 1]
        upper = cpu
        if any(rel[(a, b)] == "PXB" for a in comp for b in comp if a != b):
            upper = f"pcie{n_sw}"
            n_sw += 1
            d.add(Device(upper, DeviceKind.PCIE_SWITCH, 0))
            d.connect(upper, cpu, LinkKind.PCIE, pcie, generation=pcie_gen, width=16)
        for leaf in leaves:
            sw = f"pcie{n_sw}"
            n_sw += 1
            d.add(Device(sw, DeviceKind.PCIE_SWITCH, 0))
            d.connect(sw, upper, LinkKind.PCIE, pcie, generation=pcie_gen, width=16)
            for e in leaf:
                d.connect(local[e], sw, LinkKind.PCIE, pcie, generation=pcie_gen, width=16)
                placed.add(e)
        for e in comp:
            if e not in placed:
                d.connect(local[e], upper, LinkKind.PCIE, pcie, generation=pcie_gen, width=16)
                placed.add(e)
        odd = sorted({rel[(a, b)] for a in comp for b in comp if a != b and not rel[(a, b)].startswith("NV")}
                     - {"PIX", "PXB"})
        if odd:
            d.warnings.append(f"{source}: {', '.join(comp)} are joined through PIX/PXB links yet some pairs "
                              f"among them are {'/'.join(odd)}; modelled as one PCIe tree")
    for e in ends:
        if e not in placed:
            d.connect(local[e], f"cpu{numa_of[e]}", LinkKind.PCIE, pcie, generation=pcie_gen, width=16)
    _check_numa(d, m, ends, numa_of, guessed, source)

    # Rails: GPUs to their nearest NICs, spreading GPUs over equally near NICs.
    load = dict.fromkeys(nics, 0)
    best = {g: min((PCIE_CODES.index(rel[(g, c)]) for c in nics), default=9) for g in gpus}
    for g in sorted(gpus, key=lambda g: (best[g], gpus.index(g))):
        if not nics:
            break
        pick = min(nics, key=lambda c: (PCIE_CODES.index(rel[(g, c)]), numa_of[g] != numa_of[c], load[c],
                                        nics.index(c)))
        d.gpu_nic[local[g]] = local[pick]
        load[pick] += 1
    d.summary.append(f"{len(nics)} NICs" if nics else "no NICs")
    d.summary.append(f"{len(cpus)} NUMA node(s)")
    return d


def _nvlinks(d, m, gpus, local, specs, nvlink, source) -> None:  # noqa: ANN001
    rel = m.rel
    counts = {g: {p: int(rel[(g, p)][2:]) for p in gpus if p != g and rel[(g, p)].startswith("NV")} for g in gpus}
    if not any(counts.values()):
        return
    gens = {s.fabric_gen for s in specs if s.fabric_gen}
    gen = max(gens) if gens else None
    per_link = specs[0].per_link_gbps if gen else 25.0
    if nvlink is not None and nvlink.per_link_gbps:
        per_link = nvlink.per_link_gbps
        printed = min(v for ls in nvlink.links.values() for v in ls.values() if v)
        d.cite(f"per-link NVLink speed {per_link:g} GB/s from nvidia-smi nvlink --status"
               + (f" (printed as {printed:g} GB/s, the signalling rate)" if printed != per_link else ""))
        d.warnings.extend(nvlink.warnings)
    elif gen is None:
        d.note("NVLink generation unknown (no GPU model): 25 GB/s per link assumed; pass --gpu-model")
    else:
        d.note(f"NVLink {gen}: {per_link:g} GB/s per link per direction (docs/hardware.md)")
    max_links = max((s.max_links for s in specs if s.fabric_gen), default=18)
    switched = any(sum(c.values()) > max_links for c in counts.values())
    if switched:
        d.add(Device("nvswitch", DeviceKind.NVSWITCH, 0))
        for g in gpus:
            if not counts[g]:
                d.warnings.append(f"{source}: {g} has no NVLink in an NVSwitch system")
                continue
            k = max(counts[g].values())
            if len(set(counts[g].values())) > 1:
                d.warnings.append(f"{source}: {g} has unequal NVLink counts {sorted(set(counts[g].values()))} "
                                  f"to its peers behind NVSwitch; modelled with {k}")
            if nvlink is not None and g[3:].isdigit() and int(g[3:]) in nvlink.active:
                active = nvlink.active[int(g[3:])]
                if active != k:
                    d.warnings.append(f"{source}: {g} shows NV{k} but nvlink --status lists {active} active links")
            d.connect(local[g], "nvswitch", LinkKind.NVLINK, k * per_link, count=k, generation=gen,
                      latency_us=NVSWITCH_LINK_LATENCY_US)
        d.summary.append(f"NVSwitch ({max(max(c.values()) for c in counts.values() if c)} NVLinks per GPU)")
        return
    pairs = 0
    for a_i, a in enumerate(gpus):
        for b in gpus[a_i + 1:]:
            k = counts[a].get(b)
            if k:
                d.connect(local[a], local[b], LinkKind.NVLINK, k * per_link, count=k, generation=gen)
                pairs += 1
    total = len(gpus) * (len(gpus) - 1) // 2
    d.summary.append(f"direct NVLink on {pairs} of {total} GPU pairs")


def _numa(d, m, gpus, nics, source) -> tuple[dict[str, int], set[str]]:  # noqa: ANN001
    """NUMA node of every GPU and NIC column (see topo_to_draft), and those only guessed."""
    rel = m.rel
    numa: dict[str, int] = {}
    if m.numa:
        numa.update(m.numa)
    elif m.cpu_affinity:
        lists: list[str] = []
        for g in gpus:
            cpu = m.cpu_affinity.get(g)
            if cpu is not None:
                if cpu not in lists:
                    lists.append(cpu)
                numa[g] = lists.index(cpu)
        d.note("NUMA nodes numbered by distinct CPU Affinity lists (no NUMA Affinity column)")
    ends = gpus + nics
    local_codes = ("PIX", "PXB", "PHB", "NODE")
    # Unplaced endpoints take the node of their nearest placed one (never across SYS);
    # repeat so that a NIC next to a NIC next to a GPU is placed too.
    changed = True
    while changed:
        changed = False
        for e in ends:
            if e in numa:
                continue
            near = sorted((PCIE_CODES.index(rel[(e, o)]), ends.index(o), o) for o in ends
                          if o != e and o in numa and rel[(e, o)] in local_codes)
            if near:
                numa[e] = numa[near[0][2]]
                changed = True
    rest = [e for e in ends if e not in numa]
    guessed: set[str] = set()
    if rest and not numa:
        for k, comp in enumerate(_groups(rest, lambda a, b: rel[(a, b)] in local_codes)):
            for e in comp:
                numa[e] = k
        d.note("NUMA nodes inferred from PCIe relations (no affinity columns); NVLink-only pairs say nothing")
    elif rest:
        first = min(numa.values())
        for e in rest:
            numa[e] = first
        guessed = set(rest)
        d.warnings.append(f"{source}: NUMA node of {', '.join(rest)} unknown (no GPU nearer than SYS); "
                          f"attached to NUMA node {first}")
    return numa, guessed


def _check_numa(d, m, ends, numa_of, skip, source) -> None:  # noqa: ANN001
    bad = []
    for i, a in enumerate(ends):
        for b in ends[i + 1:]:
            if a in skip or b in skip:
                continue
            code = m.rel[(a, b)]
            if code.startswith("NV"):
                continue
            if (code == "SYS") == (numa_of[a] == numa_of[b]):
                bad.append(f"{a}-{b} {code}")
    if bad:
        d.warnings.append(
            f"{source}: {len(bad)} relation(s) contradict the NUMA placement (e.g. {'; '.join(bad[:3])}); "
            "modelled by NUMA node"
        )
