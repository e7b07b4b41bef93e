"""``treeattn probe``: discover this machine's topology, or read it from saved tool output."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from treeattn.cli import app
from treeattn.cli.paths import OUT_PATH, output_file
from treeattn.cli.render import console
from treeattn.errors import InputError
from treeattn.probe import Fabric, LinkLayer, ProbeOptions, ProbeResult, probe
from treeattn.textfile import write_file
from treeattn.topology.io import dump_topology
from treeattn.topology.library import subset_topology
from treeattn.topology.model import DeviceKind, Topology
from treeattn.topology.schema import check_name

_IN = "Saved tool output"
_NET = "Nodes and network"


def _file(flag: str, what: str) -> object:
    # NOTE: no exists=True: a missing file is reported by the probe like any unreadable input
    # (one line, exit 2, naming the file and the tool it should come from).
    return typer.Option(flag, help=f"{what}, saved in this file (instead of probing live).", rich_help_panel=_IN)


@app.command("probe")
def probe_cmd(
    out: Annotated[Path | None, typer.Option("--out", "-o", **OUT_PATH,
                                             help="Write the topology YAML here.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print {topology, warnings, assumptions, source} "
                                                          "as JSON.")] = False,
    ranks: Annotated[int | None, typer.Option("--ranks", min=1, help="CPU-only host: ranks (default: CPU "
                                                                     "count).")] = None,
    from_nvidia_smi: Annotated[Path | None, _file("--from-nvidia-smi", "Output of `nvidia-smi topo -m`")] = None,
    nvlink_status: Annotated[Path | None, _file("--nvlink-status", "Output of `nvidia-smi nvlink --status`")] = None,
    from_rocm_smi: Annotated[Path | None, _file("--from-rocm-smi", "Output of `rocm-smi --showtopo`")] = None,
    from_nccl_xml: Annotated[Path | None, _file("--from-nccl-xml", "NCCL topology XML (NCCL_TOPO_DUMP_FILE)")]
    = None,
    ibstat: Annotated[Path | None, _file("--ibstat", "Output of `ibstat`")] = None,
    gpu_names: Annotated[Path | None, _file("--gpu-names", "Output of `nvidia-smi -L` or `--query-gpu=name`")] = None,
    gpu_model: Annotated[str | None, typer.Option("--gpu-model", help="GPU model of every GPU, e.g. H100-SXM5-80GB.",
                                                  rich_help_panel=_IN)] = None,
    cpu_vendor: Annotated[str, typer.Option("--cpu-vendor", help="intel or amd (socket link figures, NCCL's "
                                                                 "P2P level), when the inputs do not say.",
                                            rich_help_panel=_IN)] = "",
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="Replicate the probed node into N nodes.",
                                       rich_help_panel=_NET)] = 1,
    nic_gbps: Annotated[float | None, typer.Option("--nic-gbps", help="NIC line rate, Gb/s, where the inputs lack "
                                                                      "it: a port's (a device of merged ports, "
                                                                      "mlx5_0+mlx5_1, takes it once a port).",
                                              rich_help_panel=_NET)] = None,
    nics: Annotated[str | None, typer.Option("--nics", metavar="COUNT[xGBIT]", help="NICs to assume when the "
                                             "inputs show none, each GBIT Gb/s (line rate, a port's as "
                                             "--nic-gbps), e.g. 8x400.",
                                             rich_help_panel=_NET)] = None,
    fabric: Annotated[Fabric, typer.Option("--fabric", help="How nodes are joined.", rich_help_panel=_NET)]
    = Fabric.RAIL,
    link_layer: Annotated[LinkLayer | None, typer.Option("--link-layer", help="What the NICs run on where the "
                                                         "inputs do not say (ibstat's 'Link layer'); default: "
                                                         "InfiniBand, noted.", rich_help_panel=_NET)] = None,
    name: Annotated[str | None, typer.Option("--name", help="Topology name.")] = None,
) -> None:
    """Discover the GPUs, NVLink/xGMI, PCIe, CPUs and NICs of this machine (nvidia-smi, rocm-smi,
    then sysfs; a CPU-only loopback host when no GPU is found), or read them from saved output."""
    out = output_file(out, "--out", "topology.yaml", kind="YAML") if out is not None else None
    if out is not None:
        from treeattn.topology.io import check_topology_path

        check_topology_path(out)
    if name is not None:
        check_name(name, "--name")  # a name the file it writes could not be read back with
    opts = ProbeOptions(
        nvidia_smi=from_nvidia_smi, nvlink_status=nvlink_status, rocm_smi=from_rocm_smi, nccl_xml=from_nccl_xml,
        ibstat=ibstat, gpu_names=gpu_names, gpu_model=gpu_model, cpu_vendor=cpu_vendor, nodes=nodes,
        nic_gbps=nic_gbps, nics=nics, fabric=fabric, link_layer=link_layer, ranks=ranks, name=name,
    )
    result = probe(opts)
    note = cpu_vendor_note(result.topology)
    if note:
        result = dataclasses.replace(result, assumptions=(*result.assumptions, note))
    if out is not None:
        try:
            write_file(out, dump_topology(result.topology))
        except OSError as exc:
            raise InputError(f"cannot write --out {str(out)!r}: {exc.strerror or exc}") from None
    if json_out:
        typer.echo(json.dumps(result.to_dict(), sort_keys=True, indent=2))
        return
    _summary(result, out)


def cpu_vendor_note(topo: Topology) -> str:
    """Where the CPU vendor is unknown (sockets left unnamed: NCCL's choices as on Intel,
    ``treeattn.cost.nccl_rates.cpu_vendor``) and it decides which GPU pairs NCCL connects
    peer-to-peer (``nccl_rates.p2p_level``: SYS on an AMD host of at most two GPUs), what to
    say: those pairs move through host memory, a tenth of their PCIe rate. Looked at on node 0
    alone, the nodes being copies of it; empty where the vendor is known or changes nothing."""
    from treeattn.cost.nccl_rates import p2p_level, shm_pairs

    cpus = [d for d in topo.devices if d.kind is DeviceKind.CPU]
    if not any(d.node == 0 for d in cpus) or any(d.model for d in cpus):
        return ""
    intel = subset_topology(topo, tuple(r for r in range(topo.num_ranks) if topo.rank_device(r).node == 0))
    amd = dataclasses.replace(intel, devices=tuple(dataclasses.replace(d, model="AMD") if d.kind is DeviceKind.CPU
                                                   else d for d in intel.devices))
    here, there = shm_pairs(intel), shm_pairs(amd)
    if here == there:
        return ""
    n = intel.num_ranks
    return (f"CPU vendor unknown: NCCL's P2P level as on an Intel host ({p2p_level(intel, 0)}), so {here} of "
            f"{n * (n - 1)} GPU pairs of a node go through host memory; on AMD ({p2p_level(amd, 0)}) {there} "
            "would; pass --cpu-vendor amd or intel")


def _summary(result: ProbeResult, out: Path | None) -> None:
    topo = result.topology
    con = console()
    con.print(f"[bold]{escape(topo.name)}[/]  {topo.num_ranks} ranks  {topo.fingerprint}  from {escape(result.source)}")
    con.print(escape(topo.description))
    devices = Table(title="Devices")
    for col in ("kind", "count", "models"):
        devices.add_column(col)
    kinds = Counter(d.kind.value for d in topo.devices)
    for kind, count in sorted(kinds.items()):
        models = sorted({d.model for d in topo.devices if d.kind.value == kind and d.model})
        devices.add_row(kind, str(count), ", ".join(models))
    con.print(devices)
    links = Table(title="Links (directed)")
    for col in ("kind", "count", "GB/s per direction", "latency µs"):
        links.add_column(col)
    groups: dict[str, list] = {}
    for ln in topo.links:
        groups.setdefault(ln.kind.value, []).append(ln)
    for kind, lns in sorted(groups.items()):
        bws = sorted({ln.bw_gbps for ln in lns})
        lats = sorted({ln.latency_us for ln in lns})
        links.add_row(kind, str(len(lns)), ", ".join(f"{b:g}" for b in bws), ", ".join(f"{v:g}" for v in lats))
    con.print(links)
    for w in result.warnings:
        con.print(f"[yellow]warning:[/] {escape(w)}")
    for a in result.assumptions:
        con.print(f"[dim]assumed: {escape(a)}[/]")
    if out is not None:
        con.print(f"wrote {escape(str(out))}")
