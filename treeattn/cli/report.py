"""``treeattn validate`` (measure every candidate and baseline on emulated clusters, beside the
prediction) and ``treeattn report`` (summary, tables and plots of a results folder).

    treeattn validate topologies/emu-2x4.yaml topologies/emu-pcie-tree.yaml --out results/NAME
    treeattn report results/NAME
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from treeattn.cli import app, err_console
from treeattn.cli.lists import comma_items, int_items
from treeattn.cli.options import JsonOpt, MeasureOrder, OrderOpt, load_topology
from treeattn.cli.paths import output_folder
from treeattn.cli.render import console
from treeattn.errors import ExecutionError, InputError
from treeattn.exec.deadline import MAX_ITERATIONS
from treeattn.units import counted

__all__ = ["validate_cmd", "report_cmd"]

_CASES = "Cases"
_MEASURE = "Measurement"
DEFAULT_TOPOLOGIES = ("emu-2x4", "emu-pcie-tree", "emu-mesh")
"""Shipped files (``topologies/``), found from any directory and by installed wheels too."""


def _tokens(text: str, flag: str, least: int = 0) -> int:
    t = text.strip().upper()
    try:
        n = int(t[:-1]) * 1024 if t.endswith("K") else int(t)
    except ValueError:
        raise InputError(f"{flag} {text!r}: write tokens like 256, 64K (K = 1024) or 0") from None
    if n < least:  # said in the flag's words (the cases' own check names neither flag)
        raise InputError(f"{flag} {text!r}: must be at least {counted(least, 'token')} a rank")
    return n


def _heads(text: str) -> tuple[int, int, int]:
    parts = text.replace("x", "/").split("/")
    if len(parts) != 3:
        raise InputError(f"--heads {text!r}: write HQ/HKV/D, e.g. 8/1/32")
    try:
        hq, hkv, d = (int(p) for p in parts)
    except ValueError:
        raise InputError(f"--heads {text!r}: write HQ/HKV/D with integers, e.g. 8/1/32") from None
    return hq, hkv, d


@app.command("validate")
def validate_cmd(
    topologies: Annotated[list[str] | None, typer.Argument(
        metavar="TOPOLOGY", show_default=False,
        help="Emulated topologies (files or presets), the primary first; default: "
             + ", ".join(DEFAULT_TOPOLOGIES) + ".")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Results folder to write (rows.csv, timeline.csv, "
                                      "meta.json, calibration/, summary.json and the plots).")] = Path(
        "results/validate"),
    ranks: Annotated[str | None, typer.Option("--ranks", help="Use only these ranks of every topology "
                                              "(0-3, 0,4).")] = None,
    batches: Annotated[str, typer.Option("--batches", help="Batch sizes of the payload sweep.",
                                         rich_help_panel=_CASES)] = "1,4,16,64",
    tokens: Annotated[str, typer.Option("--tokens", help="KV tokens per rank of the sweep cases.",
                                        rich_help_panel=_CASES)] = "32",
    long_tokens: Annotated[str, typer.Option("--long-tokens", help="Tokens per rank of the long-context case "
                                             "(B = 1); 0 leaves it out.", rich_help_panel=_CASES)] = "64K",
    heads: Annotated[str, typer.Option("--heads", help="Head shape HQ/HKV/D of every case (scaled to the emulated "
                                       "links: see treeattn.validate.cases).", rich_help_panel=_CASES)] = "8/1/32",
    families: Annotated[str | None, typer.Option("--families", help="Candidate families to measure, comma "
                                                 "separated (default: all).", rich_help_panel=_CASES)] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1, max=MAX_ITERATIONS,
                                         help="Timed rounds of every case (a round times "
                                         "each of the case's methods once).", rich_help_panel=_MEASURE)] = 15,
    case_seconds: Annotated[float, typer.Option(
        "--case-seconds", min=0.0, rich_help_panel=_MEASURE,
        help="More rounds for cheap cases: as many as the case's predicted times fit in this many seconds, up "
             f"to 10x --repeats and at most {MAX_ITERATIONS} (0: --repeats for every case).")] = 10.0,
    warmup: Annotated[int, typer.Option("--warmup", min=0, max=MAX_ITERATIONS, help="Untimed iterations first.",
                                        rich_help_panel=_MEASURE)] = 1,
    order: OrderOpt = MeasureOrder.INTERLEAVED,
    scale: Annotated[float, typer.Option("--scale", min=1e-9, help="Factor on every emulated link's bandwidth.",
                                         rich_help_panel=_MEASURE)] = 1.0,
    calibrate: Annotated[bool, typer.Option("--calibrate/--no-calibrate", help="Calibrate inside each emulated "
                                            "cluster first and plan/predict on the fitted topology.",
                                            rich_help_panel=_MEASURE)] = True,
    calibrated: Annotated[list[Path] | None, typer.Option(
        "--calibrated", show_default=False, rich_help_panel=_MEASURE,
        help="Fitted topology (treeattn calibrate -o) to plan and predict on instead of calibrating, one per "
             "TOPOLOGY in order.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the search and of q, K, V.",
                                      rich_help_panel=_MEASURE)] = 0,
    timeout: Annotated[float, typer.Option("--timeout", min=0.001, help="Seconds one measured operation may "
                                           "wait.", rich_help_panel=_MEASURE)] = 300.0,
    max_load: Annotated[float | None, typer.Option(
        "--max-load", min=0.0, rich_help_panel=_MEASURE,
        help="Wait (up to --max-wait) until the 1-minute load average is at most this before calibrating and "
             "before measuring: the ranks share the host's cores with whatever else runs.")] = None,
    max_wait: Annotated[float, typer.Option("--max-wait", min=0.0, help="Seconds to wait for --max-load.",
                                            rich_help_panel=_MEASURE)] = 600.0,
    realtime: Annotated[bool, typer.Option("--realtime/--no-realtime", rich_help_panel=_MEASURE,
                                           help="Run the ranks under SCHED_RR so other work on the host does not "
                                                "delay them (root; others keep 5 % of the CPU).")] = False,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Render the report when done.")] = True,
    json_out: JsonOpt = False,
) -> None:
    """Emulate each TOPOLOGY, calibrate inside it, and measure the best plan of every candidate family,
    the planner's pick and the baselines at payloads from latency- to bandwidth-bound, beside the
    simulator's prediction (root and iproute2)."""
    from treeattn.topology.io import load_topology as load_file
    from treeattn.validate import CalibrationSettings, HeadShape, TopologyTarget, ValidateOptions, default_cases
    from treeattn.validate import validate as run_validate

    fams = tuple(comma_items(families, "--families", "family names", distinct=True)) if families is not None else None
    batch_counts = tuple(int_items(batches, "--batches", least=1, distinct=True))
    options = ValidateOptions(repeats=repeats, case_seconds=case_seconds, warmup=warmup, scale=scale, seed=seed,
                              op_timeout_s=timeout,
                              calibrate=calibrate, calibration=CalibrationSettings(), families=fams,
                              max_load=max_load, max_wait_s=max_wait, realtime=realtime, order=order.value)
    specs = list(topologies or DEFAULT_TOPOLOGIES)
    if calibrated and len(calibrated) != len(specs):
        raise InputError(f"--calibrated names {len(calibrated)} files for {len(specs)} topologies; give one per "
                         "topology, in the same order")
    hq, hkv, d = _heads(heads)
    try:
        shape = HeadShape(hq, hkv, d)
    except InputError as exc:  # the shape's own words, after the flag that gave it
        raise InputError(f"--heads {heads!r}: {exc}") from None
    per_rank, long_per_rank = _tokens(tokens, "--tokens", least=1), _tokens(long_tokens, "--long-tokens")
    targets = []
    for i, spec in enumerate(specs):
        topo = load_topology(spec, ranks)
        cases = default_cases(topo, batches=batch_counts, tokens_per_rank=per_rank,
                              long_tokens_per_rank=long_per_rank, heads=shape)
        fitted = load_file(calibrated[i]) if calibrated else None
        if fitted is not None and (fitted.on_gpus or fitted.num_ranks != topo.num_ranks):
            what = (f"a GPU machine's ({fitted.name!r})" if fitted.on_gpus else
                    f"{fitted.num_ranks} ranks' ({fitted.name!r}) where {spec} has {topo.num_ranks}")
            raise InputError(f"--calibrated {calibrated[i]}: a fit of {what}; validate measures the emulated "
                             f"machine's CPU ranks: give a `treeattn calibrate` file of {spec} (or leave "
                             "--calibrated out: validate calibrates in each cluster)")
        targets.append(TopologyTarget(topo, tuple(cases), fitted, spec))
    seen: dict[str, int] = {}
    for i, target in enumerate(targets):  # rows are told apart by the topology's name
        if (first := seen.setdefault(target.topology.name, i)) != i:
            raise InputError(f"topologies {targets[first].source!r} and {target.source!r} are both named "
                             f"{target.topology.name!r}, which tells their rows apart: give each machine once, under "
                             "a name of its own")
    out = output_folder(out, "--out")  # made once every flag has been read
    from treeattn.emulate.layout import plan_layout

    for target in targets:  # each one's emulation laid out (no I/O) before the first is measured
        plan_layout(target.topology, scale=scale)
    command = shlex.join(["treeattn", *sys.argv[1:]]) if Path(sys.argv[0]).name == "treeattn" else ""
    from treeattn.interrupts import exit_status, interrupts_raise

    rows = out / "rows.csv"  # written after each topology (run_validate)
    before = rows.stat().st_mtime_ns if rows.is_file() else None  # an older run's, in the same folder
    try:
        with interrupts_raise():
            run_validate(targets, out, options, command=command,
                         progress=lambda line: err_console.print(f"[dim]{escape(line)}[/]"))
    except KeyboardInterrupt as exc:
        # Not bad input (2): the shell's status for the signal (Ctrl-C 130, SIGTERM 143, SIGHUP 129).
        done = rows.is_file() and rows.stat().st_mtime_ns != before
        stopped = ExecutionError(f"interrupted; the topologies finished so far are in {out}" if done else
                                 "interrupted before the first topology finished: nothing was written")
        stopped.exit_code = exit_status(exc)
        raise stopped from None
    _render(out, plots=plots, json_out=json_out)


@app.command("report")
def report_cmd(
    folder: Annotated[Path, typer.Argument(metavar="RESULTS", help="Results folder of treeattn validate.")],
    timeline: Annotated[str | None, typer.Option(
        "--timeline", help="Plan whose timeline to draw: TOPOLOGY:CASE:METHOD, CASE:METHOD or METHOD; "
                           "parts may be empty (default: the primary topology's first pick).")] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots",
                                        help="Write the PNGs (summary.json and README.md always).")] = True,
    json_out: JsonOpt = False,
) -> None:
    """Summarize a results folder (prediction error, regret, speedups, targets) and draw the
    predicted-vs-measured scatter, one plan's timeline and the speedup bars into it."""
    _render(folder, timeline=timeline, plots=plots, json_out=json_out)


def _render(folder: Path, *, timeline: str | None = None, plots: bool = True, json_out: bool = False) -> None:
    from treeattn.report import render_folder, summary_json
    from treeattn.report.render import TIMELINE_PNG
    from treeattn.report.tables import cases_table, errors_table, regret_table, targets_table

    parts: list[str | None] = [None, None, None]
    if timeline is not None:
        given = timeline.rsplit(":", 2)  # a family spec's name holds ':' too (rtx4090:gpus=2)
        parts[3 - len(given):] = [p or None for p in given]
    done = render_folder(folder, topology=parts[0], case=parts[1], method=parts[2], plots=plots)
    if json_out:
        typer.echo(summary_json(done.summary), nl=False)
        return
    con = console()
    con.print(cases_table(done.summary))
    con.print(errors_table(done.summary))
    con.print(targets_table(done.summary))
    con.print(regret_table(done.summary))
    drew = done.timeline and any(p.name == TIMELINE_PNG for p in done.files)
    # escaped: a selection's "[ranks 0,4]" is markup to rich, and vanished from the name --timeline takes
    shown = f" (timeline: {escape(':'.join(done.timeline))})" if drew else ""
    con.print("wrote " + ", ".join(escape(str(p)) for p in done.files) + shown)
