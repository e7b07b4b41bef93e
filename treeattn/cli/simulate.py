"""``treeattn simulate`` (time a plan with the cost model) and ``treeattn nccl-model``
(what NCCL's own tuner would pick for a collective on a topology)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from treeattn.cli import app, err_console
from treeattn.cli.paths import OUT_PATH, output_file
from treeattn.cli.render import console, note_attention, plan_title, print_rates_note, warn_topology
from treeattn.cli.topo_text import wrap
from treeattn.errors import InputError, PlanInvalidError
from treeattn.figures import save_figure
from treeattn.units import fixed, format_size, parse_size

if TYPE_CHECKING:
    from treeattn.cost.simulate import SimResult

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (sorted keys) instead of tables.")]
MAX_GANTT_RANKS = 64
PATH_SHOWN = 10


def _echo_json(data: object) -> None:
    typer.echo(json.dumps(data, sort_keys=True, indent=2))


@app.command("simulate")
def simulate_cmd(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="Plan file (YAML or JSON).")],
    topology: Annotated[
        str | None,
        typer.Option("--topology", "-t", help="Preset name (e.g. dgx-h100:nodes=2) or a topology YAML file; "
                                              "default: the topology the plan names."),
    ] = None,
    json_out: JsonOpt = False,
    timeline: Annotated[
        Path | None, typer.Option("--timeline", **OUT_PATH, help="Draw a per-rank Gantt chart into this PNG file.")
    ] = None,
) -> None:
    """Predict a plan's time on a topology: total, lower bound, per-rank finish, critical path.

    The lower bound is what no plan of this workload can beat on this topology: the slowest
    partial attention (compute), or the first one plus the largest of depth (the fewest
    merge steps any order needs, at the routes' latency), cut (the bytes that must cross the
    topology's narrowest cut) and spread (where every rank must end with every contribution:
    how soon one rank's data can reach them all). treeattn/cost/bounds.py derives each.
    """
    from treeattn.cost.bounds import plan_bounds
    from treeattn.cost.library import link_rates_note
    from treeattn.cost.memory import kv_overflow
    from treeattn.cost.simulate import simulate
    from treeattn.plan.io import load_plan
    from treeattn.plan.validate import check
    from treeattn.topology.library import resolve, resolve_recorded

    if timeline is not None:
        timeline = output_file(timeline, "--timeline", f"{plan_file.stem}.timeline.png", suffix=".png")
    plan = load_plan(plan_file)
    try:  # a time for a plan that does not compute the merge would mislead: verify's check first, as run does
        check(plan)
    except PlanInvalidError as exc:
        raise PlanInvalidError(f"{plan_file}: {exc}") from None
    ref = plan.topology
    topo = resolve(topology) if topology is not None else resolve_recorded(ref.name, ref.fingerprint, ref.source,
                                                                           plan_file, what=str(plan_file),
                                                                           ranks=plan.ranks)
    if topo.num_ranks != plan.ranks:  # before the warning below: one line, and no hint of a --ranks simulate lacks
        raise InputError(f"--topology {topology!r} places {topo.num_ranks} ranks but {plan_file} runs on "
                         f"{plan.ranks}; pass a topology of the plan's ranks, or none (the plan's own)")
    warn_topology(topo)
    note_attention(topo, plan.workload)
    mismatch = plan.topology.fingerprint != topo.fingerprint
    if mismatch:
        err_console.print(
            f"warning: plan was made for {plan.topology.name} ({plan.topology.fingerprint}); "
            f"simulating on {topo.name} ({topo.fingerprint})",
            markup=False,
        )
    over = kv_overflow(plan.workload, topo) if mismatch else None
    if over:
        err_console.print(f"warning: the plan's KV cache does not fit: {over}", markup=False)
    try:
        res = simulate(plan, topo, timeline=True)
    except PlanInvalidError as exc:  # name the file, as verify does
        raise PlanInvalidError(f"{plan_file}: {exc}") from None
    recorded = plan.predicted_us
    if mismatch or recorded is None or math.isclose(recorded, res.predicted_us, rel_tol=1e-9, abs_tol=1e-9):
        recorded = None  # another topology's time differs by design
    else:  # the file's figure is what plan printed; a reader comparing the two is told which is which
        err_console.print(f"note: {plan_file} records predicted_us {fixed(plan.predicted_us, 3)}; the simulation "
                          f"gives {fixed(res.predicted_us, 3)} on the same topology (the file was edited, or made "
                          "by another release of treeattn's model)", markup=False)
    merger_us = _merger_call_us(plan, topo)
    bounds = plan_bounds(plan, topo)
    gap = res.predicted_us / bounds.bound_us if bounds.bound_us > 0 else None
    drawn = None
    if timeline is not None:
        drawn = _draw_timeline(res, timeline, f"{plan.algorithm} on {topo.name}")
    path = _path_rows(res)
    if json_out:
        _echo_json({
            "plan": {"file": str(plan_file), "algorithm": plan.algorithm, "chunks": plan.chunks, "ranks": plan.ranks},
            "topology": {"name": topo.name, "fingerprint": topo.fingerprint, "link_rates_note": link_rates_note(topo)},
            "fingerprint_mismatch": mismatch,
            "kv_overflow": over,
            "predicted_us": res.predicted_us,
            "recorded_predicted_us": recorded,
            "merger_call_us": merger_us,
            "lower_bound_us": bounds.bound_us,
            "gap": gap,
            "bounds": bounds.to_dict(),
            "per_rank_finish_us": list(res.per_rank_finish_us),
            "critical_path": path,
            "events": res.events,
            "transfers": res.transfers,
            "timeline_png": None if timeline is None else {"file": str(timeline), "ranks_drawn": drawn},
        })
        return
    con = console()
    con.print(f"{plan_title(plan)} on [bold]{escape(topo.name)}[/]")
    print_rates_note(con, topo)
    con.print(f"predicted   {fixed(res.predicted_us, 3, 12)} µs")
    if merger_us is not None:
        con.print(f"merge only  {fixed(merger_us, 3, 12)} µs   a Merger call: partials given, no attention")
    term = bounds.cut if bounds.cut in ("compute", "depth", "spread") else f"the cut {bounds.cut}"
    con.print(f"lower bound {fixed(bounds.bound_us, 3, 12)} µs   set by {term} (see --help)")
    con.print(f"  terms: depth {fixed(bounds.latency_us, 3)}, cut {fixed(bounds.bandwidth_us, 3)}, "
              f"spread {fixed(bounds.spread_us, 3)}, "
              f"compute {fixed(bounds.compute_us, 3)} µs")
    con.print(f"gap         {fixed(gap, 2, 12)} x" if gap is not None else "gap         n/a (bound is 0)")
    _print_finish(con, res.per_rank_finish_us)
    table = Table(title=f"Critical path (first {min(PATH_SHOWN, len(path))} of {len(path)} ops)")
    for col in ("rank", "op", "kind", "peer", "chunk", "start µs", "end µs"):
        table.add_column(col, justify="right" if col not in ("kind",) else "left")
    for row in path[:PATH_SHOWN]:
        table.add_row(*(("" if row[k] is None else fixed(row[k], 3) if isinstance(row[k], float) else str(row[k]))
                        for k in ("rank", "op", "kind", "peer", "chunk", "start_us", "end_us")))
    con.print(table)
    if path:
        last = path[-1]
        tail = res.per_rank_finish_us[last["rank"]] - last["end_us"]
        after = (f"; after its last op, rank {last['rank']}'s own work takes {fixed(tail, 3)} µs more, to the "
                 f"predicted {fixed(res.predicted_us, 3)} µs") if tail > 1e-9 else ""
        con.print(escape("\n".join(wrap("Between ops a rank runs its own work: merges and copies, conversions for "
                                         "the wire, and the overhead of each message it issues (on GPUs, of each "
                                         f"peer's group){after}.", ""))))
    if timeline is not None:
        note = f" (the first {drawn} of {plan.ranks} ranks)" if drawn < plan.ranks else ""
        con.print(f"timeline drawn to {escape(str(timeline))}{note}")


def _merger_call_us(plan, topo) -> float | None:  # noqa: ANN001 - a Plan and a Topology
    """A ``Merger`` call's predicted time (the partials given), for plans that merge given
    partials; None for raw payloads and plans that move KV."""
    from treeattn.cost.simulate import simulate
    from treeattn.plan.validate import given_partial_problem

    if given_partial_problem(plan):
        return None
    return simulate(plan, topo, timeline=False, given_partials=True).predicted_us


def _path_rows(res: SimResult) -> list[dict]:
    by = {(t.rank, t.op): t for t in res.timeline or ()}
    rows = []
    for rank, op in res.critical_path:
        t = by[(rank, op)]
        rows.append({"rank": rank, "op": op, "kind": t.kind, "peer": t.peer, "chunk": t.chunk,
                     "start_us": t.start_us, "end_us": t.end_us})
    return rows


def _print_finish(con, finish: tuple[float, ...]) -> None:  # noqa: ANN001 - a Console
    if len(set(finish)) == 1:
        con.print(f"finish µs   {fixed(finish[0])} on every rank")
        return
    if len(finish) <= 8:
        con.print("finish µs   " + "  ".join(f"r{r}={fixed(t)}" for r, t in enumerate(finish)))
        return
    last = sorted(range(len(finish)), key=lambda r: (-finish[r], r))[:3]
    con.print(f"finish µs   min {fixed(min(finish))}  median {fixed(statistics.median(finish))}  "
              f"max {fixed(max(finish))}"
              f" (r{last[0]}, then " + ", ".join(f"r{r}" for r in last[1:]) + ")")


_COLORS = {"compute": "#4c72b0", "send": "#dd8452", "recv_merge": "#55a868", "recv_copy": "#8172b3",
           "collective": "#c44e52"}


def _draw_timeline(res: SimResult, path: Path, title: str) -> int:
    """Draw the first ``MAX_GANTT_RANKS`` ranks' ops as bars; returns how many ranks were drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = min(len(res.per_rank_finish_us), MAX_GANTT_RANKS)
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.25 * ranks))
    for t in res.timeline or ():
        if t.rank >= ranks:
            continue
        # A rank's send and receive of one step overlap: sends in the upper half of its row.
        y, h = (t.rank - 0.4, 0.4) if t.kind == "send" else (t.rank - 0.4, 0.8) if t.kind == "compute" else (
            t.rank, 0.4)
        ax.broken_barh([(t.start_us, max(t.end_us - t.start_us, 1e-9))], (y, h), facecolors=_COLORS[t.kind])
    ax.set_ylim(ranks - 0.5, -0.5)
    ax.set_xlabel("time (µs)")
    ax.set_ylabel("rank")
    shown = "" if ranks == len(res.per_rank_finish_us) else f" (ranks 0-{ranks - 1} of {len(res.per_rank_finish_us)})"
    ax.set_title(f"{title}: {fixed(res.predicted_us)} µs{shown}")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in _COLORS.items()], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    return ranks


def _release(release: tuple[int, int, int]) -> str:
    """The NCCL release a prediction follows, as text (one newer than the model's: said so)."""
    from treeattn.topology.nccl_version import NEWEST, release_text

    if release > NEWEST:
        return f"{release_text(release)}, modelled with {release_text(NEWEST)}'s figures (the newest it follows)"
    return release_text(release)


@app.command("nccl-model")
def nccl_model_cmd(
    topology: Annotated[str, typer.Option("--topology", "-t",
                                          help="Preset name (e.g. dgx-h100:nodes=2) or a topology YAML file.")],
    collective: Annotated[
        str, typer.Option("--collective", "-c", help="allreduce, allgather, reducescatter, broadcast or reduce.")
    ],
    nbytes: Annotated[str, typer.Option("--bytes", help="Size: 4096, 1M, 16KB, 1MiB (1K, 1M as nccl-tests' "
                                                         "-b/-e and KiB, MiB: powers of 1024; KB, MB: of 1000).")],
    dtype: Annotated[str, typer.Option("--dtype", help="Data type, as nccl-tests' -d names it (float, half, "
                                                       "bfloat16, int32, ...) or fp32/bf16/fp16/fp8.")] = "float",
    op: Annotated[str, typer.Option("--op", help="Reduction: sum, prod, max, min, avg or mulsum (nccl-tests' -o); "
                                                 "NVLink SHARP reduces only some.")] = "sum",
    json_out: JsonOpt = False,
) -> None:
    """NCCL's pick, and every algorithm x protocol its tuning model considers, for one collective."""
    from treeattn.cost import nccl, nccl_fabric, nccl_tuning
    from treeattn.cost.library import link_rates_note
    from treeattn.cost.nvls import DTYPE_ALIASES, REDUCTION_DTYPES, REDUCTION_OPS, dtype_name
    from treeattn.plan.ir import REDUCTIONS
    from treeattn.topology.library import resolve

    name = dtype_name(dtype)
    if name not in REDUCTION_DTYPES:
        raise InputError(f"--dtype {dtype!r}: choose one of {', '.join(REDUCTION_DTYPES)} (or "
                         f"{', '.join(DTYPE_ALIASES)})")
    if op.lower() not in REDUCTION_OPS:
        raise InputError(f"--op {op!r}: choose one of {', '.join(REDUCTION_OPS)}")
    reduction = (name, op.lower())
    elem = REDUCTION_DTYPES[name]

    coll = nccl_tuning.Collective.parse(collective)
    topo = resolve(topology)
    if topo.num_ranks < 2:  # NCCL moves nothing for one rank: a table of zeros would answer nothing
        raise InputError(f"--topology {topology!r} places {topo.num_ranks} rank; a collective needs at least 2")
    if topo.on_hosts:  # an NCCL table for gloo ranks would read as a prediction for them
        raise InputError(f"--topology {topology!r} places its ranks on hosts, where gloo runs the collectives, "
                         "not NCCL; treeattn simulate times a plan's gloo collectives there")
    size = parse_size(nbytes, "--bytes", least=1)
    if size % elem:
        raise InputError(f"--bytes must be a whole number of {name} elements ({elem} bytes each), got {size}")
    warn_topology(topo)
    fab = nccl_fabric.fabric(topo)
    nvls = (nccl_tuning.Algorithm.NVLS, nccl_tuning.Algorithm.NVLS_TREE)
    every = nccl.predict(fab, coll, size, elem_bytes=elem)
    ests = [e for e in every if nccl.nvls_offered(coll, reduction) or e.algorithm not in nvls]
    best = nccl.pick(fab, coll, size, elem_bytes=elem, reduction=reduction)
    # Said only where the model would otherwise have listed NVLS (its all-reduces).
    nvls_note = (f"NVLink SHARP does not reduce {reduction[0]} by {reduction[1]}: NCCL offers no NVLS here"
                 if len(ests) < len(every) else None)
    ll128_note = ("RCCL (to 2.21.5) runs LL128 on gfx90a GPUs only: no LL128 row is picked"
                  if nccl.topo_rccl_without_ll128(fab, None) and any(e.protocol.value == "LL128" for e in ests)
                  else None)
    release = _release(fab.nccl_release)
    if json_out:
        _echo_json({
            "topology": {"name": topo.name, "fingerprint": topo.fingerprint, "link_rates_note": link_rates_note(topo)},
            "nccl_release": release,
            "collective": coll.value,
            "dtype": reduction[0],
            "op": reduction[1] if coll.value in REDUCTIONS else None,
            "nvls_note": nvls_note,
            "ll128_note": ll128_note,
            "bytes": size,
            "ranks": fab.ranks,
            "nodes": fab.nodes,
            "bus_bw_gbps": fab.bus_bw_gbps,
            "tree_bus_bw_gbps": fab.tree_bus_bw_gbps,
            "bus_limit": fab.limit,
            "shm_gbps": fab.shm_gbps or None,
            "pick": best.to_dict(),
            "estimates": [e.to_dict() for e in ests],
        })
        return
    con = console()
    from treeattn.topology.nccl_version import NEWEST

    newer = fab.nccl_release > NEWEST  # _release says which release's figures time it
    library = (f"NCCL {release}" if not fab.rccl else f"RCCL, timed with NCCL {release}" if newer
               else f"RCCL, timed with NCCL {release}'s figures")
    # One fact a line, so that piped output stays near 80 columns.
    con.print(f"{coll.value} of {format_size(size)} on [bold]{escape(topo.name)}[/]: "
              f"{fab.ranks} ranks, {fab.nodes} node(s)")
    con.print(f"{library}; the fabric's bus bandwidth {fab.bus_bw_gbps:.4g} GB/s "
              f"(tree {fab.tree_bus_bw_gbps:.4g} GB/s)")
    if fab.nodes == 2 and fab.tree_bus_bw_gbps > fab.bus_bw_gbps:
        con.print("(tree: on two nodes each byte crosses the network once each way)")
    print_rates_note(con, topo)
    for limit in filter(None, fab.limit.split("; ")):
        con.print(f"capped by the routes: {limit}", markup=False)
    for note in filter(None, (nvls_note, ll128_note)):
        con.print(note, markup=False)
    if fab.shm_gbps:
        con.print("GPU pairs NCCL does not connect peer-to-peer: its estimate rates their path at that figure;")
        con.print(f"what runs moves at most {fab.shm_gbps:.3g} GB/s of bus bandwidth through host memory")
        con.print("(NCCL's shared-memory transport)")
    table = Table()
    for col in ("pick", "algorithm", "protocol", "time µs", "picks by µs", "latency µs", "algbw GB/s", "busbw GB/s"):
        table.add_column(col, justify="left" if col in ("pick", "algorithm", "protocol") else "right")
    for e in ests:
        table.add_row("*" if e == best else "", e.algorithm.value, e.protocol.value, fixed(e.time_us),
                      fixed(e.rank_us), fixed(e.latency_us), f"{e.algbw_gbps:.2f}", f"{e.busbw_gbps:.2f}")
    con.print(table)
    con.print("time µs: what runs; picks by µs: the tuner's own estimate, which ranks the choices")
    # plan and simulate time the same call plus the host's cost of issuing it (treeattn/cost/nccl.py):
    # say so, or the two commands print the same all-reduce as two figures.
    if topo.cost.overhead_us and not topo.on_hosts:
        con.print(f"(plan and simulate add cost.overhead_us, {topo.cost.overhead_us:g} µs, per call: "
                  "nccl-tests overlaps it)")
    allpairs = best.algorithm is nccl_tuning.Algorithm.ALLPAIRS
    who = ("RCCL runs its MSCCL all-pairs algorithm ahead of its tuner" if allpairs
           else "RCCL's pick (NCCL's tuning figures)" if fab.rccl else "NCCL's pick")
    con.print(f"{who}: {best.algorithm.value}/{best.protocol.value}, {best.time_us:.2f} µs, "
              f"busbw {best.busbw_gbps:.2f} GB/s")
