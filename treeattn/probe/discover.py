"""``probe``: one entry point over the parsers, for saved tool output or the live machine.

Order on a live machine: ``nvidia-smi topo -m`` (with ``--query-gpu=name`` and
``nvlink --status``), then ``rocm-smi --showtopo``, then sysfs; ``ibstat`` adds NIC rates
when present. No GPU at all gives a CPU-only loopback host of ``ranks`` processes (the
``cpu`` topology family), labelled as such.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from treeattn.errors import ProbeError
from treeattn.probe.build import Fabric, LinkLayer, NodeDraft, ProbeResult, add_assumed_nics, assume_link_layer, finish
from treeattn.probe.gpus import GpuCatalog, parse_gpu_names
from treeattn.probe.ibstat import apply_ibstat, parse_ibstat
from treeattn.probe.nccl_xml import nccl_xml_to_draft, parse_nccl_xml
from treeattn.probe.nvlink_status import parse_nvlink_status
from treeattn.probe.nvsmi_topo import parse_topo_matrix, topo_to_draft
from treeattn.probe.rocm_smi import parse_rocm_showtopo, rocm_to_draft
from treeattn.probe.sysfs import sysfs_to_draft
from treeattn.probe.text import read_input

__all__ = ["ProbeOptions", "probe", "cpu_host", "run_tool", "parse_nics"]

Runner = Callable[[list[str]], "str | None"]


def run_tool(cmd: list[str]) -> str | None:
    """Run a vendor tool; its stdout, or None when it is missing, fails or hangs (30 s)."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and done.stdout.strip() else None


def parse_nics(text: str) -> tuple[int, float | None]:
    """``--nics`` value ``COUNT`` or ``COUNTxGBIT`` (e.g. ``8x400``) -> (count, Gb/s or None)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX*]\s*(\d+(?:\.\d+)?)\s*(?:[gG]b(?:ps|/s)?)?)?\s*", text or "")
    if not m or int(m.group(1)) < 1 or (m.group(2) and not math.isfinite(float(m.group(2)))):
        raise ProbeError(f"--nics {text!r}: write COUNT or COUNTxGBIT, e.g. 8x400 (8 NICs of 400 Gb/s)")
    return int(m.group(1)), float(m.group(2)) if m.group(2) else None


@dataclass(frozen=True)
class ProbeOptions:
    """What ``treeattn probe`` was asked; every file is optional (none: probe this machine)."""

    nvidia_smi: Path | None = None
    """Saved ``nvidia-smi topo -m``."""
    nvlink_status: Path | None = None
    """Saved ``nvidia-smi nvlink --status`` (with ``nvidia_smi``)."""
    rocm_smi: Path | None = None
    """Saved ``rocm-smi --showtopo``."""
    nccl_xml: Path | None = None
    """NCCL topology XML (``NCCL_TOPO_DUMP_FILE``)."""
    ibstat: Path | None = None
    gpu_names: Path | None = None
    """``nvidia-smi -L`` / ``--query-gpu=name`` / ``rocm-smi --showproductname`` listing."""
    gpu_model: str | None = None
    cpu_vendor: str = ""
    """``intel``/``amd`` for the socket link, when the inputs do not say."""
    nodes: int = 1
    nic_gbps: float | None = None
    nics: str | None = None
    """``COUNT`` or ``COUNTxGBIT``."""
    fabric: Fabric = Fabric.RAIL
    link_layer: LinkLayer | None = None
    """The NICs' link layer where the inputs do not say it (None: InfiniBand, noted)."""
    ranks: int | None = None
    """CPU-only host: ranks (default: CPU count)."""
    name: str | None = None
    root: Path = Path("/")
    """Filesystem root for sysfs (tests point it at a fake tree)."""


def probe(opts: ProbeOptions, runner: Runner = run_tool) -> ProbeResult:
    """Discover a topology from saved tool output, or from this machine when none is given.

    Args:
        opts: inputs and flags.
        runner: runs a tool for live probing (tests pass a fake).

    Returns:
        The topology with its warnings, assumptions and source.

    Raises:
        ProbeError: unreadable or damaged input, conflicting flags.
    """
    given = [p for p in (opts.nvidia_smi, opts.rocm_smi, opts.nccl_xml) if p is not None]
    if len(given) > 1:
        raise ProbeError("give only one of --from-nvidia-smi, --from-rocm-smi, --from-nccl-xml")
    if opts.nvlink_status is not None and opts.nvidia_smi is None:
        raise ProbeError("--nvlink-status needs --from-nvidia-smi (it gives link speeds, not the wiring)")
    if opts.nodes < 1:
        raise ProbeError(f"--nodes must be >= 1, got {opts.nodes}")
    if opts.cpu_vendor.lower() not in ("", "intel", "amd", "genuineintel", "authenticamd"):
        raise ProbeError(f"--cpu-vendor {opts.cpu_vendor!r}: choose intel or amd")
    # nan fails both comparisons, so it is refused too; inf would be written as .inf, which
    # the topology reader refuses.
    if opts.nic_gbps is not None and not (0 < opts.nic_gbps < math.inf):
        raise ProbeError(f"--nic-gbps must be a finite number > 0, got {opts.nic_gbps}")
    if opts.name is not None and not opts.name.strip():
        # '' would fall back to the default name unseen, and ' ' names a topology no file may hold
        raise ProbeError(f"--name {opts.name!r}: give the topology a name (or leave --name out)")
    names: tuple[str, ...] = ()
    if opts.gpu_names is not None:
        names = parse_gpu_names(read_input(opts.gpu_names, "GPU name listing"), opts.gpu_names.name)

    # Read before anything is probed: a bad --nics or --ibstat is bad input on a host without GPUs too.
    assumed_nics = parse_nics(opts.nics) if opts.nics is not None else None
    ib = parse_ibstat(read_input(opts.ibstat, "ibstat"), opts.ibstat.name) if opts.ibstat is not None else None
    if given:
        draft, source = _from_files(opts, names)
    else:
        draft, source = _live(opts, names, runner)
        if draft is None:
            host = cpu_host(opts.ranks, name=opts.name, nodes=opts.nodes, source=source)
            unused = [flag for flag, value in (("--ibstat", opts.ibstat), ("--nics", opts.nics),
                                               ("--nic-gbps", opts.nic_gbps), ("--link-layer", opts.link_layer))
                      if value is not None]
            gpu_flags = [flag for flag, value in (("--gpu-model", opts.gpu_model), ("--gpu-names", opts.gpu_names))
                         if value is not None]
            said = [f"{', '.join(flags)} ignored: no GPU was found{why}" for flags, why in (
                (unused, ", and a CPU host's ranks talk over loopback"), (gpu_flags, "")) if flags]
            if said:  # said, as --ranks is where GPUs are found
                host = dataclasses.replace(host, warnings=(*host.warnings, *said))
            return host

    if ib is not None:
        apply_ibstat(draft, ib, opts.ibstat.name)
    if assumed_nics is not None:
        add_assumed_nics(draft, *assumed_nics)
    if opts.link_layer is not None:
        assume_link_layer(draft, LinkLayer(opts.link_layer))
    if opts.ranks is not None:
        draft.warnings.append(f"--ranks {opts.ranks} ignored: GPUs were found, one rank each")
    name = opts.name or _default_name(opts, given)
    return finish(draft, name=name, source=source, nodes=opts.nodes, nic_gbps=opts.nic_gbps, fabric=opts.fabric)


def _default_name(opts: ProbeOptions, given: list[Path]) -> str:
    base = given[0].stem if given else socket.gethostname() or "host"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-") or "host"
    return f"probed-{slug}" + (f"-x{opts.nodes}" if opts.nodes > 1 else "")


def _from_files(opts: ProbeOptions, names: tuple[str, ...]) -> tuple[NodeDraft, str]:
    if opts.nvidia_smi is not None:
        path = opts.nvidia_smi
        matrix = parse_topo_matrix(read_input(path, "nvidia-smi topo -m"), path.name)
        nvlink = None
        if opts.nvlink_status is not None:
            nv = opts.nvlink_status
            nvlink = parse_nvlink_status(read_input(nv, "nvidia-smi nvlink --status"), nv.name)
            if not names:
                names = tuple(nvlink.names[i] for i in sorted(nvlink.names))
        catalog = GpuCatalog(names, opts.gpu_model, vendor="nvidia")
        draft = topo_to_draft(matrix, catalog, nvlink=nvlink, cpu_vendor=opts.cpu_vendor, source=path.name)
        return draft, f"nvidia-smi topo -m ({path.name})"
    if opts.rocm_smi is not None:
        path = opts.rocm_smi
        parsed = parse_rocm_showtopo(read_input(path, "rocm-smi --showtopo"), path.name)
        draft = rocm_to_draft(parsed, GpuCatalog(names, opts.gpu_model, vendor="amd"), cpu_vendor=opts.cpu_vendor,
                              source=path.name)
        return draft, f"rocm-smi --showtopo ({path.name})"
    path = opts.nccl_xml
    assert path is not None
    root = parse_nccl_xml(read_input(path, "NCCL topology XML"), path.name)
    if names:
        raise ProbeError("--gpu-names does not apply to an NCCL XML (it names GPUs by PCI id); use --gpu-model")
    draft = nccl_xml_to_draft(root, GpuCatalog((), opts.gpu_model), source=path.name)
    return draft, f"NCCL topology XML ({path.name})"


def _live(opts: ProbeOptions, names: tuple[str, ...], runner: Runner) -> tuple[NodeDraft | None, str]:
    notes: list[str] = []
    topo = runner(["nvidia-smi", "topo", "-m"])
    if topo is not None:
        matrix = parse_topo_matrix(topo, "live nvidia-smi topo -m")
        if not names:
            listed = runner(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
            names = parse_gpu_names(listed, "live nvidia-smi --query-gpu=name") if listed else ()
        status = runner(["nvidia-smi", "nvlink", "--status"])
        nvlink = parse_nvlink_status(status, "live nvidia-smi nvlink --status") if status else None
        draft = topo_to_draft(matrix, GpuCatalog(names, opts.gpu_model, vendor="nvidia"), nvlink=nvlink,
                              cpu_vendor=opts.cpu_vendor or _cpu_vendor(opts.root), source="nvidia-smi topo -m")
        return _live_ibstat(draft, opts, runner), "live: nvidia-smi topo -m"
    rocm = runner(["rocm-smi", "--showtopo"])
    if rocm is not None:
        parsed = parse_rocm_showtopo(rocm, "live rocm-smi --showtopo")
        draft = rocm_to_draft(parsed, GpuCatalog(names, opts.gpu_model, vendor="amd"),
                              cpu_vendor=opts.cpu_vendor or _cpu_vendor(opts.root), source="rocm-smi --showtopo")
        return _live_ibstat(draft, opts, runner), "live: rocm-smi --showtopo"
    if runner(["amd-smi", "version"]) is not None:
        notes.append("amd-smi found but not parsed (no rocm-smi); NVLink/xGMI unknown")
    draft = sysfs_to_draft(opts.root, GpuCatalog((), opts.gpu_model))
    if draft.gpus:
        draft.warnings.extend(notes)
        return _live_ibstat(draft, opts, runner), "live: sysfs"
    return None, "live: no GPU found (nvidia-smi, rocm-smi and sysfs)"


def _live_ibstat(draft: NodeDraft, opts: ProbeOptions, runner: Runner) -> NodeDraft:
    if opts.ibstat is None and any(i.rate_gbps is None for i in draft.nics.values()):
        text = runner(["ibstat"])
        if text is not None:
            apply_ibstat(draft, parse_ibstat(text, "live ibstat"), "ibstat")
    return draft


def _cpu_vendor(root: Path) -> str:
    try:
        text = (root / "proc" / "cpuinfo").read_text()
    except OSError:
        return ""
    m = re.search(r"^vendor_id\s*:\s*(\S+)", text, re.M)
    return m.group(1) if m else ""


def cpu_host(ranks: int | None = None, *, name: str | None = None, nodes: int = 1, source: str = "") -> ProbeResult:
    """A CPU-only host: ``ranks`` processes over loopback (the ``cpu`` family), labelled.

    Args:
        ranks: processes; default ``os.cpu_count()``.
        name: topology name (default ``cpu-loopback``).
        nodes: must be 1 (several CPU hosts are not probed; use a topology file).
        source: what was tried, for the result.

    Returns:
        The topology and a warning that its figures are the cpu family's built-in profile.
    """
    from treeattn.topology.families import build_family

    if nodes != 1:
        raise ProbeError(f"--nodes {nodes}: no GPU was found, and a CPU-only host is probed as one node; "
                         "describe several CPU hosts in a topology file")
    n = ranks if ranks is not None else (os.cpu_count() or 1)
    if n < 1:
        raise ProbeError(f"--ranks must be >= 1, got {n}")
    from treeattn.topology.schema import FieldError

    try:
        base = build_family("cpu", {"ranks": n})
    except FieldError as exc:  # the family's parameter is the flag's (or the CPU count's) value
        given = f"--ranks {n}" if ranks is not None else f"{n} ranks (the CPU count; --ranks sets it)"
        raise ProbeError(f"{given}: {exc.message.removeprefix(f'ranks={n}: ')}") from None
    topo = dataclasses.replace(
        base,
        name=name or "cpu-loopback",
        description=(f"CPU-only loopback host (no GPU found): {n} ranks as processes on one host of "
                     f"{base.cost.host.host_cores} cores, gloo over TCP loopback. Its figures are the cpu family's "
                     "built-in "
                     "profile (measured on another machine) for `treeattn calibrate` to replace."),
    )
    topo.check_routable()
    warning = ("no GPU found: CPU-only loopback host with the cpu family's built-in figures; run `treeattn "
               "calibrate` to fit them to this machine")
    given = "--ranks" if ranks is not None else "the CPU count; --ranks sets it"
    return ProbeResult(topo, (warning,), (f"{n} ranks ({given})",), source or "cpu host")
