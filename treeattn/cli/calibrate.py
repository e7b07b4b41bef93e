"""``treeattn calibrate``: fit link latency/bandwidth, overhead and compute constants from
live ping-pong on this machine's ranks, or from saved nccl-tests logs."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from treeattn.cli import app, err_console
from treeattn.cli.lists import int_items
from treeattn.cli.options import Backend, JsonOpt
from treeattn.cli.paths import OUT_PATH, output_file
from treeattn.cli.progress import progress_reporter
from treeattn.cli.render import console
from treeattn.errors import InputError
from treeattn.exec.deadline import MAX_ITERATIONS
from treeattn.units import format_size, parse_size

__all__ = ["calibrate_cmd"]

_LIVE = "Live measurement"


class Kernel(StrEnum):
    """Which executor kernel's fit sets launch_us and mem_efficiency."""

    MERGE = "merge"
    SUM = "sum"
    ATTENTION = "attention"
    NONE = "none"


@app.command("calibrate")
def calibrate_cmd(
    logs: Annotated[list[Path] | None, typer.Argument(metavar="LOG", show_default=False,
                                                      help="More nccl-tests logs (with --from-nccl-tests).")] = None,
    topology: Annotated[str | None, typer.Option("--topology", "-t", help="Preset name or topology YAML to measure "
                                                 "(or map the logs onto); default: probe this machine.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", **OUT_PATH,
                                             help="Write the fitted topology YAML here.")] = None,
    png: Annotated[Path | None, typer.Option("--png", **OUT_PATH,
                                             help="Plot a live calibration's measured times against the fitted "
                                                  "lines (logs: check-model LOG... -t TOPOLOGY --png FILE).")] = None,
    from_nccl_tests: Annotated[list[Path] | None, typer.Option(
        "--from-nccl-tests", show_default=False,
        help="Fit from saved nccl-tests/rccl-tests output (the text printed, or the JSON file -J writes) instead "
             "of measuring (all_reduce_perf, sendrecv_perf, ...; repeat the flag or list the files after it).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1, max=MAX_ITERATIONS,
                                         help="Timed iterations per case (medians).",
                                         rich_help_panel=_LIVE)] = 10,
    warmup: Annotated[int, typer.Option("--warmup", min=0, max=MAX_ITERATIONS, help="Untimed iterations first.",
                                        rich_help_panel=_LIVE)] = 2,
    min_size: Annotated[str, typer.Option("--min-size", help="Smallest ping-pong message.",
                                          rich_help_panel=_LIVE)] = "4B",
    max_size: Annotated[str, typer.Option("--max-size", help="Largest ping-pong message.",
                                          rich_help_panel=_LIVE)] = "64MiB",
    sizes: Annotated[int, typer.Option("--sizes", min=2, help="Log-spaced sizes from min to max.",
                                       rich_help_panel=_LIVE)] = 13,
    round_trips: Annotated[str, typer.Option("--round-trips", help="Round-trip counts per size, e.g. 1,4 (two or "
                                             "more separate the per-iteration skew).", rich_help_panel=_LIVE)] = "1,4",
    contention: Annotated[bool, typer.Option("--contention/--no-contention", help="Concurrent-flow and fan-in "
                                             "tests.", rich_help_panel=_LIVE)] = True,
    compute: Annotated[Kernel, typer.Option("--compute", help="Kernel whose fit sets launch_us and "
                                            "mem_efficiency (merge: attention plans; sum: raw payloads).",
                                            rich_help_panel=_LIVE)] = Kernel.MERGE,
    attention_shape: Annotated[str, typer.Option("--attention-shape", help="HQ/HKV/D: the heads and head dim the "
                                                 "attention kernel is timed with (--compute attention); use your "
                                                 "model's.", rich_help_panel=_LIVE)] = "32/8/128",
    backend: Annotated[Backend | None, typer.Option("--backend", help="Default: nccl on CUDA, else gloo.",
                                                    rich_help_panel=_LIVE)] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.001, help="Seconds one operation may wait.",
                                           rich_help_panel=_LIVE)] = 60.0,
    realtime: Annotated[bool, typer.Option("--realtime", help="Run the ranks under SCHED_RR, so that other work on a "
                                           "shared host preempts them less (root only).",
                                           rich_help_panel=_LIVE)] = False,
    env: Annotated[list[str] | None, typer.Option(
        "--env", metavar="NAME=VALUE", help="With --from-nccl-tests: a setting the logs ran with that chose the "
        "algorithm (NCCL_ALGO, NCCL_PROTO, NCCL_NVLS_ENABLE, RCCL_MSCCL_ENABLE, RCCL_MSCCL_ENABLE_SINGLE_PROCESS), "
        "for what the fit says of it; repeat for several.")] = None,
    nccl_version: Annotated[str | None, typer.Option(
        "--nccl-version", metavar="VERSION", help="With --from-nccl-tests: the NCCL release the logs ran with, "
        "where they print none (2.21.5, a series 2.21, a bound <2.23): the fitted topology's cost.nccl_version "
        "(rccl-tests logs: RCCL's, checked against what they print, not written). NCCL_DEBUG=VERSION makes a run "
        "print it.")] = None,
    partial: Annotated[bool, typer.Option(
        "--partial", help="With --from-nccl-tests: fit a log that ends inside its table (a run that stopped "
        "early or failed; -J's file too) on its whole rows, saying so, instead of refusing it.")] = False,
    json_out: JsonOpt = False,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                  help="Progress of a live calibration on stderr (runs done, then "
                                                  "the fits): a bar on a terminal, else a line every 10 s.")] = None,
    ctx: typer.Context = None,  # noqa: RUF013 - typer fills it
) -> None:
    """Measure this machine's ranks (ping-pong per route class, concurrent flows, merge kernel) and
    write the fitted latency, bandwidth, overhead and compute constants into the topology; or fit
    them from nccl-tests logs (--from-nccl-tests LOG... --topology TOPOLOGY)."""
    from treeattn.topology.library import resolve

    paths = [*(from_nccl_tests or []), *(logs or [])]
    if paths and png is not None:  # the plot draws live measurements; refused rather than left undrawn
        raise InputError("--png plots a live calibration's measurements; for nccl-tests logs draw predicted "
                         "against measured with treeattn check-model LOG... -t TOPOLOGY --png FILE")
    out = output_file(out, "--out", "calibrated.yaml", kind="YAML") if out is not None else None
    if out is not None:
        from treeattn.topology.io import check_topology_path

        check_topology_path(out)
    png = output_file(png, "--png", "calibration.png", suffix=".png") if png is not None else None
    if logs and not from_nccl_tests:
        raise InputError(f"unexpected argument {str(logs[0])!r}: log files go after --from-nccl-tests")
    if paths and (live := _live_options_given(ctx)):
        raise InputError(f"{', '.join(live)}: {'options' if len(live) > 1 else 'an option'} of a live "
                         "calibration; --from-nccl-tests fits the logs as they were measured")
    if paths:
        if topology is None:
            raise InputError("--from-nccl-tests needs --topology: the machine the logs were measured on")
        from treeattn.calibrate.nccl_tests import looks_like_a_log

        if looks_like_a_log(topology):
            raise InputError(f"--topology {topology!r}: an nccl-tests log, not a topology: give logs after "
                             "--from-nccl-tests, and the machine they ran on here")
        from treeattn.cli.options import nccl_env_flags, topology_flag

        _from_logs(topology_flag(topology), paths, out, json_out, topology, nccl_version, nccl_env_flags(env or []),
                   partial)
        return
    if nccl_version is not None or env:
        raise InputError(f"{'--nccl-version' if nccl_version is not None else '--env'} names what nccl-tests logs "
                         "ran with (--from-nccl-tests); a live calibration measures this machine as it is")
    if partial:
        raise InputError("--partial takes nccl-tests logs cut short (--from-nccl-tests); a live calibration "
                         "measures this machine")
    # Every argument is read before torch's import (seconds): a bad one is said at once.
    named = resolve(topology) if topology is not None else None
    trips = tuple(int_items(round_trips, "--round-trips", least=1, distinct=True))
    if len(trips) < 2:  # said before the run: the fit's per-iteration term would read 0, unsaid
        err_console.print(f"[yellow]warning:[/] --round-trips {escape(round_trips)}: one count cannot separate "
                          "the per-iteration skew from the latency (fitted as 0); give two, e.g. 1,4")
    try:
        hq, hkv, hd = (int(x) for x in attention_shape.split("/"))
    except ValueError:
        raise InputError(f"--attention-shape {attention_shape!r}: write HQ/HKV/D, e.g. 32/8/128") from None
    if min(hq, hkv, hd) < 1 or hq % hkv:
        raise InputError(f"--attention-shape {attention_shape!r}: heads and head dim must be >= 1 and HKV must "
                         "divide HQ")
    min_bytes, max_bytes = parse_size(min_size, "--min-size"), parse_size(max_size, "--max-size")
    from treeattn.calibrate.live import CalibrateOptions, calibrate

    options = CalibrateOptions(min_bytes=min_bytes, max_bytes=max_bytes, sizes=sizes,
                               round_trips=trips, repeats=repeats, warmup=warmup, contention=contention,
                               compute=compute.value, backend=backend.value if backend else None, timeout_s=timeout,
                               attention_heads=(hq, hkv, hd))
    from treeattn.exec.launch import detect_env
    from treeattn.exec.predict import ranks_on_gpus
    from treeattn.exec.runner import RunOptions, pick_backend
    from treeattn.validate.run import realtime_priority

    # A backend this machine cannot run (nccl without CUDA) is said as such, not as a mismatch below.
    pick_backend(RunOptions(backend=options.backend))
    topo = named if named is not None else _probe()
    if topo.on_gpus != ranks_on_gpus(options.backend):
        # The fit would give the topology's links what these ranks measure: loopback TCP for NVLink.
        made, runs = ("GPUs", "CPU processes (gloo)") if topo.on_gpus else ("CPU ranks", "GPUs (nccl)")
        which = f"--topology {topology!r}" if topology is not None else f"this machine's probed topology {topo.name!r}"
        raise InputError(f"{which} places its ranks on {made}, but they run here on {runs}: "
                         + ("calibrate on the machine it describes, or a topology of this one (cpu:ranks=N, or "
                            "none: probed)" if topology is not None else
                            f"use --backend {'nccl' if topo.on_gpus else 'gloo'}, or a topology of these ranks"))
    placed = detect_env()  # under torchrun/SLURM only rank 0 reports (as run)
    with realtime_priority(realtime), \
            progress_reporter(progress if placed is None or placed.rank == 0 else False, "calibrating") as update:
        report = calibrate(topo, options, update)
    if report is None:  # a non-zero rank of torchrun/SLURM
        return
    _write(out, report.topology)
    if png is not None:
        from treeattn.calibrate.plot import plot_calibration

        plot_calibration(report, png)
    if json_out:
        typer.echo(json.dumps({**report.to_dict(), "out": _shown(out), "png": _shown(png)}, sort_keys=True, indent=2))
        return
    _tables(report, out, png)


def _shown(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _live_options_given(ctx: typer.Context | None) -> list[str]:
    """The live measurement's options given on the command line (their flags), which a fit
    from logs would leave unused."""
    if ctx is None:
        return []
    # typer runs on a click of its own: its ParameterSource is read by name
    return ["/".join(opt.opts + opt.secondary_opts) for opt in ctx.command.params
            if getattr(opt, "rich_help_panel", None) == _LIVE
            and getattr(ctx.get_parameter_source(opt.name), "name", "") == "COMMANDLINE"]


def _probe():  # noqa: ANN202 - a Topology
    from treeattn.probe import ProbeOptions, probe

    return probe(ProbeOptions()).topology


def _write(out: Path | None, topo) -> None:  # noqa: ANN001 - a Topology
    if out is None:
        return
    from treeattn.textfile import write_file
    from treeattn.topology.io import dump_topology

    try:
        write_file(out, dump_topology(topo))
    except OSError as exc:
        raise InputError(f"cannot write --out {str(out)!r}: {exc.strerror or exc}") from None


def _from_logs(topo, paths: list[Path], out: Path | None, json_out: bool,  # noqa: ANN001 - a Topology
               spec: str, nccl_version: str | None, env: dict[str, str], partial: bool) -> None:
    from treeattn.calibrate.from_nccl_tests import calibrate_from_nccl_tests

    result = calibrate_from_nccl_tests(topo, paths, spec, nccl_version, env, partial)
    _write(out, result.topology)
    if json_out:
        typer.echo(json.dumps({**result.to_dict(), "out": _shown(out)}, sort_keys=True, indent=2))
        return
    con = console()
    table = Table(title=f"nccl-tests fits mapped onto {escape(topo.name)} ({topo.num_ranks} ranks)")
    for col in ("log", "collective", "ranks", "sizes", "α/step µs", "fit bus GB/s", "R²", "class", "α µs", "β GB/s"):
        table.add_column(col, justify="left" if col in ("log", "collective", "class") else "right")
    # A log by its file name (narrow columns), by its path where two logs share a name.
    names = [Path(lf.source).name for lf in result.logs]
    shown = names if len(set(names)) == len(names) else [lf.source for lf in result.logs]
    for lf, name in zip(result.logs, shown, strict=True):
        f = lf.fit
        table.add_row(escape(name), f.collective, str(f.ranks), f"{f.points}", f"{f.alpha_step_us:.3g}",
                      f"{f.beta_link_gbps:.4g}", f"{f.fit.r2:.4f}",
                      f"{lf.scope}: {lf.route_class}".replace(">", "> "),  # breaks where 80 columns need
                      f"{lf.alpha_us:.3g}", f"{lf.beta_gbps:.4g}")
    con.print(table)
    con.print("fit bus GB/s: the bus bandwidth of the line fitted to the log's times\n"
              "(α + size / β), not its largest busbw; α µs, β GB/s: what the links of the\n"
              "route class got")
    for lf in result.logs:
        for note in lf.notes:
            err_console.print(f"[yellow]note:[/] {escape(lf.source)}: {escape(note)}")
    for w in result.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(w)}")
    con.print(f"overhead_us stays {result.topology.cost.overhead_us:g} (nccl-tests cannot separate it)"
              + (f"; wrote {escape(str(out))}" if out else ";\nnothing written: --out FILE keeps the fitted topology"))


def fitted_terms(cost, *names: str) -> str:  # noqa: ANN001 - CostParams
    """``name value`` for each cost term that is set, as the fitted topology holds it."""
    return ", ".join(f"{n} {getattr(cost, n):.4g}" for n in names if getattr(cost, n) is not None)


def _tables(report, out: Path | None, png: Path | None) -> None:  # noqa: ANN001 - a CalibrationReport
    from treeattn.calibrate.live import median_abs_rel_error

    con = console()
    cost = report.topology.cost
    fits = Table(title=f"Fit per route class · {report.measured_on} · {report.topology.num_ranks} ranks · "
                       f"{report.backend} · t = α + n/β per message")
    for col in ("class", "pair", "pairs", "α µs", "β GB/s", "per-iteration µs", "R²", "max |resid|"):
        fits.add_column(col, justify="left" if col == "class" else "right")
    for c in report.classes:
        worst = max(abs(r) / p.median_us for r, p in zip(c.fit.residuals, c.points, strict=True))
        fits.add_row(c.route_class.name, f"{c.route_class.pair}", str(len(c.route_class.pairs)),
                     f"{c.fit.alpha_us:.1f}", f"{c.fit.beta_gbps:.3g}", f"{c.fit.skew_us:.0f}", f"{c.fit.r2:.4f}",
                     f"{worst:.0%}")
    con.print(fits)
    points = Table(title="Ping-pong iterations (µs): measured median vs the fit (per-iteration + 2R·(α + n/β))")
    for col in ("class", "size", "R", "measured", "±", "fitted", "residual"):
        points.add_column(col, justify="left" if col == "class" else "right")
    for c in report.classes:
        for p, r in zip(c.points, c.fit.residuals, strict=True):
            points.add_row(c.route_class.name, format_size(p.nbytes), str(p.round_trips), f"{p.median_us:,.0f}",
                           f"{p.spread_us / 2:,.0f}", f"{p.median_us - r:,.0f}",
                           f"{r / p.median_us:+.0%}")
    con.print(points)
    if report.compute is not None:
        k = report.compute
        con.print(f"compute ({k.kernel} kernel, {k.threads} thread{'s' * (k.threads > 1)}): launch {k.launch_us:.1f} "
                  f"µs, {k.eff_bw_gbps:.3g} GB/s effective (R² {k.fit.r2:.3f}) → "
                  + fitted_terms(cost, "launch_us", "mem_efficiency"))
    if report.attention is not None:
        k = report.attention
        con.print(f"attention kernel (a plan's COMPUTE op): launch {k.launch_us:.1f} µs, {k.eff_bw_gbps:.3g} GB/s "
                  f"effective (R² {k.fit.r2:.3f}) → "
                  + fitted_terms(cost, "attn_launch_us", "attn_gbps", "attn_next_launch_us"))
    if report.host is not None:
        h = report.host
        loop = (f", loopback {h.loopback_gbps:.3g} GB/s for all flows together" if h.loopback_gbps else "")
        step = f", step_us {h.step_us:.1f} per step of transfers" if h.step_us else ""
        if h.coll_cpu_us is not None:
            step += f", coll_cpu_us {h.coll_cpu_us:.1f} per message end inside a collective"
        if h.start_cpu_us or h.cpu_us_per_kb:
            step += (f"; from the ranks' measured CPU time also: cpu_us_per_kb {h.cpu_us_per_kb:.2f} per KiB at each "
                     f"end (off the path), start_cpu_us {h.start_cpu_us:.1f} per rank as a run begins")
        factors = "".join(f", {what} x{f:.2f}" for what, f in (("attention bandwidth", h.attn_factor),
                                                                ("attention launch", h.attn_launch_factor),
                                                                ("merge launch", h.merge_factor)) if f is not None)
        con.print(f"host CPU terms (fitted to all {h.cases} cases through the simulator, rms log error "
                  f"{h.rms_log_error:.3f}): {h.cores} cores shared by the ranks, cpu_us {h.cpu_us:.1f} per message "
                  f"end{step}, wakeup_us {h.wakeup_us:.0f}{loop}{factors}")
    else:
        con.print(f"per-message overhead {cost.overhead_us:.1f} µs (sender-side completion of messages ≤ 1 KiB)")
    cases = Table(title="Every measured case · predicted by the simulator on the fitted topology (µs; CPU: the "
                        "ranks' CPU time in one iteration, summed)")
    with_cpu = any(cs.predicted_cpu_us is not None and cs.measured_cpu_us for cs in report.cases)
    for col in ("case", "size", "flows", "R", "measured", "±", "predicted", "error",
                *(("CPU measured", "CPU predicted") if with_cpu else ())):
        cases.add_column(col, justify="left" if col == "case" else "right")
    for cs in report.cases:
        name = cs.label if cs.kind in ("tree", "collective") else cs.kind
        cpu = ((f"{cs.measured_cpu_us or 0:,.0f}", f"{cs.predicted_cpu_us or 0:,.0f}") if with_cpu else ())
        cases.add_row(name, format_size(cs.nbytes), str(cs.flows), str(cs.round_trips), f"{cs.measured_us:,.0f}",
                      f"{cs.spread_us / 2:,.0f}", f"{cs.predicted_us:,.0f}", f"{cs.rel_error:+.0%}", *cpu)
    con.print(cases)
    solo = {(c.route_class, c.nbytes): c for c in report.cases if c.kind == "pingpong"
            and c.round_trips == max(report.options.round_trips)}
    ones = {(c.route_class, c.nbytes): c for c in report.cases if c.kind == "fanin" and c.flows == 1}
    rows = [(c, solo.get((c.route_class, c.nbytes)) if c.kind == "concurrent" else ones.get((c.route_class, c.nbytes)))
            for c in report.cases if c.kind in ("concurrent", "fanin") and c.flows > 1]
    if rows:
        share = Table(title="Contention: time with k flows at once / time with one flow")
        for col in ("test", "size", "k", "measured ratio", "model ratio"):
            share.add_column(col, justify="left" if col == "test" else "right")
        for c, ref in rows:
            if ref is None:
                continue
            share.add_row(c.kind, format_size(c.nbytes), str(c.flows), f"{c.measured_us / ref.measured_us:.2f}",
                          f"{c.predicted_us / ref.predicted_us:.2f}")
        con.print(share)
    con.print(f"median |error| over {len(report.cases)} cases: {median_abs_rel_error(report.cases):.1%}; "
              f"load average {report.load_avg[0]:.1f} → {report.load_avg[1]:.1f}")
    for w in report.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(w)}")
    wrote = [str(p) for p in (out, png) if p is not None]
    if wrote:
        con.print(f"wrote {escape(', '.join(wrote))}")
