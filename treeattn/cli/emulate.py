"""``treeattn emulate``: an emulated cluster on network namespaces (root and iproute2).

    treeattn emulate up TOPOLOGY [--scale F]      build it (stays up until down)
    treeattn emulate check TOPOLOGY               routes, paths and shaped rates, measured
    treeattn emulate exec TOPOLOGY -- CMD ...     CMD once per rank, inside its namespace
    treeattn emulate run TOPOLOGY PLAN            run a plan (and --baselines) on it
    treeattn emulate status | down [--id ID]

``check``, ``exec`` and ``run`` use a cluster already ``up`` for the same topology and scale,
or bring one up and remove it when they end (also on Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from treeattn.cli import app, err_console
from treeattn.cli.options import JsonOpt, MeasureOrder, OrderOpt, RanksOpt, load_topology
from treeattn.cli.paths import OUT_PATH
from treeattn.cli.progress import progress_reporter
from treeattn.cli.render import console
from treeattn.errors import EmulationError, ExecutionError, InputError
from treeattn.exec.deadline import MAX_ITERATIONS
from treeattn.interrupts import exit_status
from treeattn.units import counted

if TYPE_CHECKING:
    from treeattn.topology.model import Topology

__all__ = ["emulate_app"]

emulate_app = typer.Typer(
    name="emulate",
    help="Emulate a topology on this machine: a network namespace per rank, Linux bridges for "
    "switches, veth links shaped with HTB (needs root and iproute2).",
    no_args_is_help=True,
)
app.add_typer(emulate_app, name="emulate")

TopoArg = Annotated[str, typer.Argument(metavar="TOPOLOGY", help="Preset name or topology YAML file "
                                        "(topologies/emu-*.yaml describe emulated machines at scale 1).")]
ScaleOpt = Annotated[float, typer.Option("--scale", min=1e-9,
                                         help="Factor on every link's bandwidth (shaped rate = bw_gbps x scale).")]
IdOpt = Annotated[str | None, typer.Option("--id", help="Run id: six hex digits (default: random for up, "
                                           "every run for down).")]


SLOW_RATIO = 0.85
"""A measured rate below this fraction of the shaped one means the host, not the shaper, limits it."""


class Interrupted(EmulationError):
    """Ctrl-C, SIGTERM or SIGHUP ended a command (after it cleaned up); the exit status is the
    shell's for that signal (130, 143, 129)."""

    exit_code = 130

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    # NOTE: typer turns KeyboardInterrupt into a *returned* 130 when not standalone; an error
    # with the signal's exit code (interrupts.exit_status) keeps the status and says why.
    try:
        yield
    except KeyboardInterrupt as exc:
        why = str(exc) or "Ctrl-C"
        raise Interrupted(f"interrupted ({why}); stopped every rank and removed what this command made",
                          exit_status(exc)) from None


@emulate_app.command("up")
def up_cmd(topology: TopoArg, scale: ScaleOpt = 1.0, ranks: RanksOpt = None, run_id: IdOpt = None,
           json_out: JsonOpt = False) -> None:
    """Create the emulated cluster of TOPOLOGY; it stays up until `treeattn emulate down`."""
    from treeattn.emulate import up

    topo = load_topology(topology, ranks)
    with _interruptible():
        cluster = up(topo, scale=scale, run_id=run_id)
    layout = cluster.layout
    links = []
    for s in layout.shapers:
        ln = topo.links[s.link]
        links.append({"link": f"{ln.src}->{ln.dst}", "ns": s.ns, "iface": s.ifname, "pairs": len(s.pairs),
                      "shaped_mbit": round(s.rate_bit / 1e6, 3), "payload_mbit": round(ln.bw_gbps * scale * 8000, 3)})
    rank_rows = [{"rank": r.rank, "device": r.device, "ns": r.ns, "ip": r.ip, "ifaces": list(r.ifaces)}
                 for r in layout.ranks]
    if json_out:
        typer.echo(json.dumps({"run_id": layout.run_id, "topology": topo.name, "scale": scale,
                               "namespaces": list(layout.namespaces), "ranks": rank_rows, "links": links},
                              sort_keys=True, indent=2))
        return
    table = Table(title=f"{escape(topo.name)} emulated as run {layout.run_id} (scale {scale:g})")
    for col in ("rank", "device", "namespace", "address", "interfaces"):
        table.add_column(col)
    for r in rank_rows:
        table.add_row(str(r["rank"]), r["device"], r["ns"], r["ip"], ", ".join(r["ifaces"]))
    con = console()
    con.print(table)
    bridges = f"{counted(len(layout.bridges), 'bridge')} in {layout.fabric_ns}" if layout.bridges else "no bridge"
    con.print(f"{bridges}, {counted(len(layout.cables), 'veth pair')}, {counted(len(links), 'shaped link')}; "
              f"remove with: treeattn emulate down --id {layout.run_id}", markup=False)


@emulate_app.command("down")
def down_cmd(run_id: IdOpt = None, json_out: JsonOpt = False) -> None:
    """Remove an emulated cluster (or all of them): kill its processes, delete its namespaces."""
    from treeattn.emulate import down

    with _interruptible():
        res = down(run_id)
    if json_out:
        typer.echo(json.dumps({"run_ids": list(res.run_ids), "namespaces": list(res.namespaces),
                               "killed": list(res.killed), "left": list(res.left)}, sort_keys=True, indent=2))
        return
    typer.echo(f"removed {counted(len(res.namespaces), 'namespace')} of {counted(len(res.run_ids), 'run')}"
               + (f", killed {len(res.killed)} process{'' if len(res.killed) == 1 else 'es'}" if res.killed else ""))
    for rid in res.left:  # another shell's validate or emulate run: removing it would kill its ranks
        typer.echo(f"left {rid}: another command runs on it and removes it as it ends "
                   f"(treeattn emulate down --id {rid} removes it now)")


@emulate_app.command("status")
def status_cmd(json_out: JsonOpt = False) -> None:
    """List the emulated clusters on this machine."""
    from treeattn.emulate import list_clusters

    # status: the state file's word (ready, creating); condition: what became of it (in use, damaged...)
    rows = [{"run_id": c["run_id"], "status": c.get("status", "?"), "condition": c["condition"],
             "topology": c.get("topology", "?"),
             "scale": c.get("scale"), "namespaces": len(c.get("live_namespaces", []))} for c in list_clusters()]
    if json_out:
        typer.echo(json.dumps(rows, sort_keys=True, indent=2))
        return
    if not rows:
        console().print("no emulated cluster is up (treeattn emulate up TOPOLOGY starts one)", markup=False)
        return
    table = Table(title="emulated clusters")
    for col in ("run id", "status", "topology", "scale", "namespaces"):
        table.add_column(col)
    for r in rows:
        # escape: a rank selection's "[ranks 0,4]" would otherwise be read as markup and vanish
        table.add_row(r["run_id"], escape(r["condition"]), escape(str(r["topology"])), str(r["scale"]),
                      str(r["namespaces"]))
    console().print(table)


@emulate_app.command("exec")
def exec_cmd(
    topology: TopoArg,
    cmd: Annotated[list[str], typer.Argument(metavar="-- CMD...", help="Command run once per rank; it sees RANK, "
                                             "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME.")],
    scale: ScaleOpt = 1.0,
    ranks: RanksOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.001,
                                           help="Seconds before every rank is stopped.")] = 600.0,
    json_out: JsonOpt = False,
) -> None:
    """Run CMD inside every rank's namespace (e.g. a calibration script) and print what each printed."""
    from treeattn.emulate import emulated, run_in_namespaces

    topo = load_topology(topology, ranks)
    with _interruptible(), emulated(topo, scale=scale) as cluster:
        results = run_in_namespaces(cluster, lambda r: list(cmd), timeout_s=timeout)
    if json_out:
        typer.echo(json.dumps([{"rank": r.rank, "returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr}
                               for r in results], sort_keys=True, indent=2))
    else:
        for r in results:
            for stream, text in (("", r.stdout), ("!", r.stderr)):
                for line in text.splitlines():
                    typer.echo(f"[r{r.rank}{stream}] {line}")
    bad = [r for r in results if r.returncode != 0]
    if bad:
        raise ExecutionError(f"rank {bad[0].rank} exited with status {bad[0].returncode}")


@emulate_app.command("check")
def check_cmd(
    topology: TopoArg,
    scale: ScaleOpt = 1.0,
    ranks: RanksOpt = None,
    seconds: Annotated[float, typer.Option("--seconds", min=0.05, help="How long each test flow sends.")] = 1.0,
    json_out: JsonOpt = False,
) -> None:
    """Check the kernel's routes and paths against the topology's and measure each link class's rate."""
    from treeattn.emulate import check, emulated

    topo = load_topology(topology, ranks)
    with _interruptible(), emulated(topo, scale=scale) as cluster:
        report = check(cluster, seconds=seconds)
    if json_out:
        typer.echo(json.dumps(report.to_dict(), sort_keys=True, indent=2))
    else:
        table = Table(title=f"{escape(topo.name)} (scale {scale:g}): payload rates, Mbit/s")
        for col, justify in (("flow", "left"), ("ranks", "left"), ("bottleneck", "left"), ("expected", "right"),
                             ("measured", "right"), ("ratio", "right"), ("path", "left"), ("64 B RTT µs", "right")):
            table.add_column(col, justify=justify)
        for f in report.flows:
            path = "—" if f.path_ok is None else ("[green]= route[/]" if f.path_ok else "[bold red]differs[/]")
            rtt = "—" if f.rtt_us is None else f"{f.rtt_us:.0f}"
            table.add_row(escape(f.label), f"{f.src}->{f.dst}", escape(f.bottleneck), f"{f.expected_mbit:.1f}",
                          f"{f.measured_mbit:.1f}", f"{f.ratio:.3f}", path, rtt)
        con = console()
        con.print(table)
        routes = escape("; ".join(report.route_errors)) or "every rank's kernel route takes the topology's first hop"
        con.print("routes: " + routes)
    slow = [f for f in report.flows if f.ratio < SLOW_RATIO]
    if slow:
        err_console.print(f"[yellow]warning:[/] {escape(slow[0].label)} reached {slow[0].ratio:.0%} of its rate: this "
                          "machine cannot move that much through the emulation; lower --scale")
    if report.route_errors or any(f.path_ok is False for f in report.flows):
        raise ExecutionError("the kernel's paths differ from the topology's routes (see above)")


@emulate_app.command("run")
def run_cmd(
    topology: TopoArg,
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="Plan file.")],
    scale: ScaleOpt = 1.0,
    ranks: RanksOpt = None,
    baselines: Annotated[bool, typer.Option("--baselines",
                                            help="Also run the baselines on the same workload.")] = False,
    repeats: Annotated[int, typer.Option("--repeats", min=1, max=MAX_ITERATIONS,
                                         help="Timed iterations per method.")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", min=0, max=MAX_ITERATIONS, help="Untimed iterations first.")] = 2,
    order: OrderOpt = MeasureOrder.INTERLEAVED,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.001, help="Seconds one operation may wait; "
                                                  "default: 10x the slowest predicted method, at least 30.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of q, K and V.")] = 0,
    out: Annotated[Path | None, typer.Option("--out", **OUT_PATH,
                                             help="CSV to append rows to (each op's times go to "
                                             "NAME.timeline.csv beside it); default results/runs/RUN-ID.csv (the "
                                             "time, then the plan's name).")] = None,
    json_out: JsonOpt = False,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                  help="Progress on stderr (runs done): a bar on a terminal, else "
                                                  "a line every 10 s.")] = None,
) -> None:
    """Run PLAN on the emulated TOPOLOGY (gloo, one rank per namespace) and compare with the prediction."""
    from treeattn.cli.run import emit_results, load_checked, run_rows
    from treeattn.emulate import emulated
    from treeattn.emulate.jobs import launch_in_cluster
    from treeattn.emulate.layout import scaled_topology
    from treeattn.exec.predict import default_timeout_s, plan_baselines, predict
    from treeattn.exec.runner import Job, PlanJob, RunOptions

    topo = load_topology(topology, ranks)
    plan = load_checked(plan_file)
    with run_rows(out, f"emu-{plan_file.stem}") as (run_id, rows):
        if plan.ranks != topo.num_ranks:
            raise InputError(f"{plan_file} has {plan.ranks} ranks but {topo.name!r} places {topo.num_ranks}; "
                             "pick a plan made for it or use --ranks")
        if plan.topology.fingerprint != topo.fingerprint:
            err_console.print(f"[yellow]warning:[/] {escape(str(plan_file))} was made for {escape(plan.topology.name)} "
                              f"({plan.topology.fingerprint}), the emulated topology is {escape(topo.name)} "
                              f"({topo.fingerprint}); predictions are for the emulated one")
        scaled = scaled_topology(topo, scale)
        methods, ring = plan_baselines(plan, scaled)
        predictions = predict(plan, scaled, methods if baselines else ())
        options = RunOptions(repeats=repeats, warmup=warmup, backend="gloo", seed=seed, baselines=baselines,
                             timeout_s=timeout if timeout is not None else default_timeout_s(predictions, 30.0),
                             order=order.value)
        for text in predictions.warnings:
            err_console.print(f"[yellow]warning:[/] {escape(text)}")
        if not topo.calibrated:  # as run says of a machine's shipped figures
            err_console.print(f"[cyan]note:[/] {escape(_uncalibrated_emulation(topo, topology))}")
        label = plan_file.name
        with _interruptible(), emulated(topo, scale=scale) as cluster, \
                progress_reporter(progress, "measuring") as update:
            result = launch_in_cluster(cluster, Job((PlanJob(label, plan, ring_order=ring),), options), progress=update)
        emit_results(result, plan, label, predictions, run_id, rows, json_out)


def _uncalibrated_emulation(topo: Topology, spec: str) -> str:
    """That ``topo``'s predictions are on its file's own figures, not fitted to its emulation on
    this host, and what predicts on fitted ones (``treeattn validate`` calibrates inside the
    emulation; the fitted file given back to ``emulate run`` would shape the links at its rates)."""
    return (f"predictions use the figures of {topo.name!r} as written, not fitted to its emulation on this host "
            f"(uncalibrated; results/validate-emu scores both); `treeattn validate {shlex.quote(spec)}` calibrates "
            "inside the emulation and predicts on the fitted figures")
