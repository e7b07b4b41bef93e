"""``treeattn topo``: list, show, validate topologies and print the file schema.

Every TOPOLOGY argument takes a shipped name (``dgx-h100-16node``), a family spec
(``dgx-h100:nodes=2048``) or a path to a YAML file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from treeattn.cli import app
from treeattn.cli.options import SchemaJsonOpt
from treeattn.cli.paths import OUT_PATH, output_file, safe_name
from treeattn.cli.render import console, print_rates_note, warn_topology
from treeattn.cli.topo_text import domain_shares, gbps, network_lines, rate_lines, shm_sentence, wrap
from treeattn.cost.nccl_rates import pair_rate_gbps, shm_pairs, shm_rate_gbps
from treeattn.topology import Topology, list_presets, resolve, topology_json_schema
from treeattn.topology.attention_fits import (
    applied_attention_fit,
    attention_by_defaults,
    fitted_figures,
    why_unfitted,
)
from treeattn.topology.summary import topology_summary
from treeattn.units import counted
from treeattn.workload import RawPayload

topo_app = typer.Typer(
    help="Inspect cluster topologies: shipped names, family specs NAME:key=value, or YAML files.",
    no_args_is_help=True,
)
app.add_typer(topo_app, name="topo")

TopoArg = Annotated[
    str, typer.Argument(metavar="TOPOLOGY", help="Shipped name, family spec NAME:key=value, or YAML file.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (sorted keys) instead of tables.")]


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, sort_keys=True, indent=2))


@topo_app.command("list")
def list_cmd(json_out: JsonOpt = False) -> None:
    """List shipped topology files and parametric families."""
    presets = list_presets()
    if json_out:
        _echo_json([p.to_dict() for p in presets])
        return
    table = Table(title="Topologies (families take NAME:key=value)")
    for col in ("name", "source", "ranks", "description"):
        table.add_column(col, overflow="fold")
    for p in presets:
        # a family's keys on a line of their own, breakable between keys
        desc = f"{p.description}\nkeys (defaults): {p.keys.replace(',', ', ')}" if p.keys else p.description
        table.add_row(escape(p.name), p.source, str(p.ranks), escape(desc))
    console().print(table)


@topo_app.command("show")
def show(
    spec: TopoArg,
    json_out: JsonOpt = False,
    png: Annotated[Path | None, typer.Option("--png", **OUT_PATH,
                                             help="Also draw the graph into this PNG file.")] = None,
) -> None:
    """Summarize a topology: devices, link kinds, domains, the network and its NICs, and
    the rate a message moves at between ranks (the cost model's, alone on its route)."""
    from treeattn.cost.library import link_rates_note

    topo = resolve(spec)
    warn_topology(topo)
    if png is not None:
        png = output_file(png, "--png", f"{safe_name(topo.name)}.png", suffix=".png")
    summary = topology_summary(topo)
    if png is not None:
        from treeattn.topology.draw import draw_topology

        draw_topology(topo, png)
    ranks = topo.num_ranks
    # Pairs whose transfers NCCL carries through host memory move far below their route's rate.
    shm_count = shm_pairs(topo)
    # The rate a message moves at alone on its route, as the cost model drains it: the
    # matrix prints this, not the narrowest link's datasheet figure (bw_gbps).
    for e in summary["from_rank0"]:
        e["rate_gbps"] = _rate(pair_rate_gbps(topo, 0, e["rank"]))
    if "bw_matrix_gbps" in summary:
        summary["rate_matrix_gbps"] = [[_rate(pair_rate_gbps(topo, i, j)) for j in range(ranks)]
                                       for i in range(ranks)]
    if json_out:
        fit, taken = applied_attention_fit(topo), fitted_figures(topo)
        _echo_json({**summary, "png": None if png is None else str(png), "shm_pairs": shm_count,
                    "attention_fit": {"fit": fit[0], **taken} if fit and taken else None,
                    "shm_gbps": shm_rate_gbps(topo) if shm_count else None, "link_rates_note": link_rates_note(topo)})
        return
    con = console()
    con.print(f"[bold]{escape(topo.name)}[/]  {summary['ranks']} ranks on {summary['nodes']} node(s)  "
              f"{topo.fingerprint}")
    for line in wrap(topo.description or "", indent=""):
        con.print(line, markup=False)
    con.print(_compute_line(topo), markup=False)
    kinds = Table(title="Devices")
    kinds.add_column("kind")
    kinds.add_column("count", justify="right")
    for kind, n in summary["devices"].items():
        kinds.add_row(kind, str(n))
    con.print(kinds)
    links = Table(title="Links (directed)")
    keys = [k for k in _LINK_COLUMNS if all(k in e for e in summary["links"].values())]
    for col in ("kind", "count", *(_LINK_COLUMNS[k] for k in keys)):
        links.add_column(col)
    for kind, entry in summary["links"].items():
        links.add_row(kind, str(entry["count"]), *(", ".join(f"{b:g}" for b in entry[k]) for k in keys))
    con.print(links)
    print_rates_note(con, topo, shm=False)  # the host-memory pairs are said under the rates they cap
    if topo.on_hosts and any(ln.has_rating for ln in topo.links):
        con.print("the links' ratings (rated_gbps, rated_latency_us) are read by nothing here:\n"
                  "on host ranks gloo's collectives and treeattn's transfers use the measured rates", markup=False)
    if summary["domains"]:
        doms = Table(title="Domains (fastest first)")
        for col in ("level", "groups", "ranks per group", "what a group's ranks share"):
            doms.add_column(col)
        for d in summary["domains"]:
            doms.add_row(d["kind"], str(d["groups"]), ", ".join(map(str, d["sizes"])), domain_shares(d, summary))
        con.print(doms)
    for line in network_lines(summary):
        con.print(line, markup=False)
    if "rate_matrix_gbps" in summary:
        mat = Table(title="Transfer rate, GB/s (row = from rank, column = to rank)")
        mat.add_column("")
        for j in range(ranks):
            mat.add_column(str(j), justify="right")
        for i, row in enumerate(summary["rate_matrix_gbps"]):
            mat.add_row(str(i), *("-" if x is None else gbps(x) for x in row))
        con.print(mat)
    else:
        classes: dict[tuple, int] = {}
        for e in summary["from_rank0"][1:]:
            key = (e["rate_gbps"], e["latency_us"], e["hops"])
            classes[key] = classes.get(key, 0) + 1
        routes = Table(title="Routes from rank 0")
        for col in ("GB/s", "latency µs", "links", "ranks"):
            routes.add_column(col, justify="right")
        for (bw, lat, hops), n in sorted(classes.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
            routes.add_row(gbps(bw), f"{lat:g}", str(hops), str(n))
        con.print(routes)
    for line in rate_lines(topo, shm_count):
        con.print(line, markup=False)
    if shm_count:
        for line in wrap(shm_sentence(topo), ""):
            con.print(line, markup=False)
    if png is not None:
        con.print(f"wrote {escape(str(png))}")


def _rate(x: float) -> float | None:
    """JSON has no infinity: a rank's rate to itself is null, as in ``bw_matrix_gbps``."""
    return None if x == float("inf") else round(x, 6)


_LINK_COLUMNS = {"bw_gbps": "GB/s per direction", "latency_us": "latency µs", "rated_gbps": "rated GB/s",
                 "rated_latency_us": "rated latency µs"}


def _compute_line(topo: Topology) -> str:
    """What rank 0's local work costs (treeattn.cost.compute): a heading, then the attention
    kernel, then merges and copies, each line within 80 columns; then, where the file sets no
    attention figures, the published fit its GPUs take, or that none does."""
    from treeattn.cost.compute import ComputeModel

    c = topo.cost
    fixed, gbps = ComputeModel.of(RawPayload(nbytes=4, ranks=topo.num_ranks), topo).attention_terms(0)
    mem = topo.rank_device(0).mem_bw_gbps
    if c.attn_gbps is not None:
        rate = f"{gbps:g} GB/s (measured)"
    else:
        rate = f"{gbps / mem:.3g} of {mem:g} GB/s" if gbps > 0 else "memory time not modelled"
    text = ("Local compute, rank 0 (docs/attention-model.md):\n"
            f"  attention {fixed:g} µs a call + KV at {rate};\n"
            f"  merges {c.launch_us:g} µs a kernel + bytes at {c.mem_efficiency:g} of memory bandwidth")
    fit = applied_attention_fit(topo)
    taken = fitted_figures(topo)
    if fit and len(taken) == 2:
        text += (f"\n  attn_launch_us and attn_efficiency: the fit to published decode kernels\n"
                 f"  on {fit[0]} (docs/attention-model.md)")
    elif fit and taken:
        text += f"\n  {next(iter(taken))}: the fit to published decode kernels on {fit[0]}"
    elif attention_by_defaults(topo):
        # Families of fitted GPUs set 12.4 us and 0.56 (H100): these figures beside them may flatter this GPU.
        note = (f"  the attention figures are launch_us and mem_efficiency: {why_unfitted(topo)} "
                "(docs/attention-model.md)")
        text += "\n" + "\n".join(wrap(note, "  "))
    return text


@topo_app.command("validate")
def validate(spec: TopoArg, json_out: JsonOpt = False) -> None:
    """Check a topology file (or name): fields, devices, links, ranks and routability."""
    topo = resolve(spec)
    warn_topology(topo)
    result = {
        "ok": True,
        "name": topo.name,
        "ranks": topo.num_ranks,
        "devices": len(topo.devices),
        "links": len(topo.links),
        "fingerprint": topo.fingerprint,
    }
    if json_out:
        _echo_json(result)
        return
    typer.echo(
        f"ok: {topo.name}: {counted(topo.num_ranks, 'rank')}, {counted(len(topo.devices), 'device')}, "
        f"{counted(len(topo.links), 'link')}, "
        f"every rank routable ({topo.fingerprint})"
    )


@topo_app.command("schema")
def schema(json_out: SchemaJsonOpt = False) -> None:
    """Print the JSON schema of topology files (explicit, compact and family forms)."""
    _echo_json(topology_json_schema())
