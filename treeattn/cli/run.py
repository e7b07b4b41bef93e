"""``treeattn run PLAN``: execute a plan on real ranks, check it, time it, compare with the prediction."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from treeattn.cli import app, err_console
from treeattn.cli.options import BackendOpt, JsonOpt, MeasureOrder, OrderOpt
from treeattn.cli.paths import OUT_PATH, appendable, output_file, output_folder
from treeattn.cli.progress import progress_reporter
from treeattn.cli.render import console
from treeattn.errors import ExecutionError, InputError, PlanInvalidError
from treeattn.exec.deadline import LONGEST_TIMEOUT_S, MAX_ITERATIONS, SETUP_TIMEOUT_S
from treeattn.interrupts import wrap_up_on_signals
from treeattn.textfile import special_file

__all__ = ["run", "load_checked", "run_rows"]


class CheckMode(StrEnum):
    """Which ranks compare their result with the single-process reference."""

    ROOT = "root"
    ALL = "all"


def load_checked(path: Path):  # noqa: ANN202 - a Plan
    """The plan in ``path``, validated; an invalid one raises naming the file, as verify does."""
    try:
        from treeattn.plan.io import load_plan
    except ImportError:
        raise InputError("this treeattn has no plan file reader (treeattn.plan.io)") from None
    from treeattn.plan.validate import check

    plan = load_plan(path)
    try:
        check(plan)
    except PlanInvalidError as exc:
        raise PlanInvalidError(f"{path}: {exc}") from None
    return plan


@app.command("run")
def run(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN",
                                              help="Plan file (from treeattn plan).")],
    baselines: Annotated[bool, typer.Option("--baselines", help="Also run the methods it competes with for its "
                                            "result layout (all: all-reduce x3 and x2, all-gather + merge; heads: "
                                            "reduce-scatter, vLLM's decode context parallel; root: all-reduce "
                                            "max + reduce; ring attention always) on the same workload.")] = False,
    repeats: Annotated[int, typer.Option("--repeats", min=1, max=MAX_ITERATIONS,
                                         help="Timed iterations per method.")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", min=0, max=MAX_ITERATIONS, help="Untimed iterations first.")] = 2,
    order: OrderOpt = MeasureOrder.INTERLEAVED,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.001, max=LONGEST_TIMEOUT_S,
                                                  help="Seconds one operation may wait "
                                                  "before its rank gives up; default: 10x the slowest predicted "
                                                  "method, at least 5 (connecting the ranks and opening their "
                                                  "communicators may take --setup-timeout).")] = None,
    setup_timeout: Annotated[float, typer.Option("--setup-timeout", min=0.001, max=LONGEST_TIMEOUT_S,
                                                  help="Seconds connecting the ranks "
                                                  "and opening their communicators may take (many nodes, a slow "
                                                  "scheduler: more).")] = SETUP_TIMEOUT_S,
    graph: Annotated[bool | None, typer.Option("--graph/--no-graph", help="Replay each method from a CUDA graph "
                                               "after its warm-up (NCCL; default: on with NCCL, falling back to "
                                               "eager with one line saying why when capture fails).")] = None,
    backend: BackendOpt = None,
    check: Annotated[CheckMode, typer.Option("--check", help="root: the result rank checks; all: every "
                                             "result rank.")] = CheckMode.ROOT,
    seed: Annotated[int, typer.Option("--seed", help="Seed of q, K and V.")] = 0,
    topology: Annotated[str | None, typer.Option("--topology", "-t", help="Topology (preset or file) to "
                                                 "predict on; default: the plan's.")] = None,
    out: Annotated[Path | None, typer.Option("--out", **OUT_PATH,
                                             help="CSV to append rows to (the plan's ops in its last "
                                             "timed run go to NAME.timeline.csv beside it, none beside a device or a "
                                             "pipe); default: a new "
                                             "file in results/runs/ named after the time and the plan.")] = None,
    json_out: JsonOpt = False,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                  help="Progress on stderr (runs done): a bar on a terminal, else "
                                                  "a line every 10 s.")] = None,
) -> None:
    """Run PLAN on its ranks (local processes, or those of torchrun/SLURM), check the result
    against a single-process reference and compare the measured time with the prediction. A
    signal once the methods are timed stops the ranks before their next run and keeps the rows
    of the runs done (exit status 128 + the signal)."""
    plan = load_checked(plan_file)  # before torch's import (seconds): a wrong path is said at once
    from treeattn.exec.launch import check_world, detect_env, launch
    from treeattn.exec.predict import (
        comparability,
        default_timeout_s,
        latent_on_cpu_note,
        plan_baselines,
        predict,
        resolve_topology,
    )
    from treeattn.exec.runner import Job, PlanJob, RunOptions, pick_backend

    placed = detect_env()
    if placed is not None:
        check_world(placed, plan.ranks)  # before the predictions and their notes: one line, at once
    reporter = placed is None or placed.rank == 0
    # Only the rank that writes the rows takes a file for them; the others check --out alone.
    with run_rows(out, plan_file.stem, reserve=reporter) as (run_id, rows):
        topo, warnings = resolve_topology(plan, topology, plan_file)
        methods, ring = plan_baselines(plan, topo)
        planned = PlanJob(plan_file.name, plan, ring_order=ring)  # a ring order it cannot take: one line, first
        # Every rank predicts: the default timeout follows from it and must be the same on all.
        predictions = predict(plan, topo, methods if baselines else ())
        options = RunOptions(repeats=repeats, warmup=warmup,
                             timeout_s=timeout if timeout is not None else default_timeout_s(predictions, 5.0),
                             setup_timeout_s=setup_timeout, backend=backend.value if backend else None,
                             check=check.value, seed=seed, baselines=baselines, order=order.value, graph=graph,
                             wrap_up=True)
        pick_backend(options)  # a backend this machine cannot run: one line, before the run's warnings
        if reporter:
            # Before the run: a user who reads these may stop it.
            spec = topology or plan.topology.name
            other, notes = comparability(topo, spec, options.backend, plan.is_raw)
            latent = latent_on_cpu_note(plan, topo)
            for text in (*warnings, *predictions.warnings, *other, *([latent] if latent else [])):
                err_console.print(f"[yellow]warning:[/] {escape(text)}")
            for text in notes:
                err_console.print(f"[cyan]note:[/] {escape(text)}")
        label = plan_file.name
        # A signal stops at once until the ranks measure; then they stop together before a run
        # and what they timed is kept, through to the rows' writing (exec.runner, exec.launch).
        with wrap_up_on_signals(keeping=False) as wrap:
            with progress_reporter(progress if reporter else False, "measuring") as update:
                result = launch(Job((planned,), options), progress=update, setup_watchdog=True)
            wrap.keeping = True
            if result is None or not reporter:  # a rank of a launcher's that writes no rows
                if wrap.signum:
                    raise SystemExit(128 + wrap.signum)
                return
            kernels = sorted({m.kernel for m in result.measurements if m.kernel != "none"})
            err_console.print(f"{result.backend} on {result.device}: attention kernel {', '.join(kernels) or 'none'}, "
                              f"merges {result.merge}, CUDA graphs {result.graphs_text}")
            if result.gpu_peak_bytes:
                from treeattn.exec.footprint import gpu_peak_line

                err_console.print(escape(gpu_peak_line(result.gpu_peak_bytes, Job((planned,), options))))
            result = _signalled(result, wrap.signum)  # since the launch returned: its rows are whole
            try:
                emit_results(result, plan, label, predictions, run_id, rows, json_out)
            except ExecutionError:  # a wrong result, its rows written: the stop is said before its error
                if result.stopped:
                    stopped_line(result, rows)
                raise
            result = _signalled(result, wrap.signum)  # as the rows were written
            if result.stopped:
                raise SystemExit(stopped_line(result, rows))  # not typer.Exit: its 130 would add "aborted"


@contextlib.contextmanager
def run_rows(out: Path | None, label: str, *, reserve: bool = True) -> Iterator[tuple[str, Path]]:
    """A run's id and the CSV it appends its rows to, checked writable before the run (as
    ``rows_path``). Without ``--out`` the file is new: made here, under an id no other run in
    ``results/runs`` has (``new_run_file``), so runs started in the same second never share one;
    a run that ends without writing a row (it failed, say) removes it again.

    Args:
        out: ``--out``, or None for ``results/runs/RUN-ID.csv``.
        label: names the plan, in the id.
        reserve: make the new file (the rank that writes the rows); False only checks.
    """
    from treeattn.exec.results import new_run_file, new_run_id
    from treeattn.interrupts import before_hard_exit

    if out is not None:
        run_id = new_run_id(label)
        yield run_id, rows_path(out, run_id)
        return
    # The file named after the time may be another run's, in use: only its folder is checked.
    folder = output_folder(Path("results") / "runs", "--out")
    if not reserve:
        run_id = new_run_id(label)
        yield run_id, folder / f"{run_id}.csv"
        return
    try:
        run_id, path = new_run_file(folder, label)
    except OSError as exc:
        raise InputError(f"cannot write --out {str(folder)!r}: {exc.strerror or exc}") from None
    def drop_if_empty() -> None:
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()

    try:
        appendable(timeline_file(path), "--out")
        with before_hard_exit(drop_if_empty):  # a rank ended from its set-up watchdog (exec.launch)
            yield run_id, path
    finally:
        drop_if_empty()


def rows_path(out: Path | None, run_id: str) -> Path:
    """The CSV a run appends its rows to (``--out``, default ``results/runs/RUN-ID.csv``), checked
    writable before the run."""
    from treeattn.exec.results import COLUMNS, TIMELINE_COLUMNS, appendable_problem

    name = f"{run_id}.csv"
    # opened once
    path = output_file(out if out is not None else Path("results") / "runs" / name, "--out", name, kind="CSV")
    timeline = timeline_file(path)
    for file, columns in ((path, COLUMNS), (timeline, TIMELINE_COLUMNS)):
        problem = file is not None and appendable_problem(file, columns)
        if problem:
            raise InputError(f"--out: {problem}")
    if timeline is not None:
        appendable(timeline, "--out")
    return path


def timeline_file(rows: Path) -> Path | None:
    """The CSV beside ``rows`` a run appends its timeline to; None where ``rows`` is a device or
    a pipe (``--out /dev/null``: a file beside it would be made in /dev)."""
    return None if special_file(rows) else rows.with_name(rows.stem + ".timeline.csv")


def emit_results(result, plan, label: str, predictions, run_id: str, path: Path,  # noqa: ANN001
                 json_out: bool) -> None:
    """Write a run's rows and timeline to ``path`` (from ``rows_path``), print them as a
    table or JSON, and fail loudly (exit 1) when any method's result was wrong."""
    from treeattn.exec.results import result_rows, rows_records, timeline_rows, write_csv

    frame = result_rows(result, {label: plan}, {label: predictions}, run_id)
    timeline = timeline_file(path)
    # Checked before the run (rows_path); a disk that filled up since, or /dev/full, fails here: the
    # measurements are printed all the same, then the failure said.
    unwritten = None
    rows_written = timeline_written = False
    try:
        write_csv(frame, path)
        rows_written = True
        if timeline is not None:
            write_csv(timeline_rows(result, run_id), timeline)
            timeline_written = True
    except OSError as exc:
        shown = "the rows printed above (their summary, without each run's time)" if not json_out else "the rows"
        unwritten = InputError(f"cannot write --out {exc.filename or str(path)!r}: {exc.strerror or exc}; "
                               + (f"the rows are in {path}, the timeline is not written" if rows_written else
                                  f"{shown} are not written"))
    if json_out:
        typer.echo(json.dumps({"rows": rows_records(frame), "rows_csv": str(path) if rows_written else None,
                               "timeline_csv": str(timeline) if timeline_written else None,
                               "calibrated": predictions.calibrated, "interrupted": _interrupted(result)},
                              sort_keys=True, indent=2))
    else:
        _table(frame, path if rows_written else None, predictions.calibrated)
        _bits_lines(frame, plan)
    if unwritten is not None:
        raise unwritten
    wrong = frame[~frame["correct"]]
    if len(wrong):
        worst = ", ".join(f"{r.method} (max relative error {r.max_rel_err}, tolerance {r.tolerance:g})"
                          for r in wrong.itertuples())
        raise ExecutionError(f"wrong result from {worst} on {label}; see {path}")


def _signalled(result, signum: int | None):  # noqa: ANN001, ANN202 - a JobResult in and out
    """``result`` stopped by ``signum`` where the ranks did not say a signal of their own (one that
    came once they were done: the rows are whole)."""
    return dataclasses.replace(result, stopped=signum) if signum and not result.stopped else result


def _timed_runs(result) -> list[tuple[str, int, int]]:  # noqa: ANN001 - a JobResult
    """Each measured method's (name, timed runs done, timed runs asked for)."""
    return [(m.method, len(m.times_us), asked) for m, asked in zip(result.measurements, result.repeats, strict=True)]


def _interrupted(result) -> dict | None:  # noqa: ANN001 - a JobResult
    """For --json: the signal that stopped the run and each method's timed runs done and asked
    for; None where no signal came."""
    import signal

    if not result.stopped:
        return None
    runs = {method: [done, asked] for method, done, asked in _timed_runs(result)}
    return {"signal": signal.Signals(result.stopped).name, "timed_runs": runs, "untimed": list(result.untimed)}


def stopped_line(result, rows: Path) -> int:  # noqa: ANN001 - a JobResult
    """Say on stderr that a signal stopped the run and over which runs its rows are; returns
    the shell's status for the signal."""
    import signal

    name = signal.Signals(result.stopped).name
    runs = _timed_runs(result)
    if all(done == asked for _, done, asked in runs) and not result.untimed:
        what = "after its last timed run: its rows are whole"
    else:
        what = ("before its last timed run: its rows are over the timed runs done ("
                + ", ".join(f"{method} {done} of {asked}" for method, done, asked in runs) + ")")
        if result.untimed:
            what += f"; not timed: {', '.join(result.untimed)}"
    err_console.print(f"interrupted by {name} {what}; rows in {rows}", markup=False, soft_wrap=True)
    return 128 + result.stopped


def _table(frame, path: Path | None, calibrated: bool) -> None:  # noqa: ANN001 - a DataFrame
    con = console()
    first = frame.iloc[0]
    # Two short lines (within 80 columns for the usual names), not one long title: the workload
    # and what predicted it, then the plan, its ranks and backend as the table's title.
    if frame["predicted_us"].map(_missing).all():  # the plan's topology was not found: nothing predicted
        what = f"not predicted ({first['topology']} not found, or changed since the plan: pass --topology)"
    else:
        what = f"predicted on {first['topology']}{'' if calibrated else ' (uncalibrated)'}"
    con.print(escape(f"{first['workload']}; {what}"))
    table = Table(title=escape(f"{first['plan']} · {first['algorithm']} · {first['ranks']} ranks ({first['backend']}) "
                               "· µs"))
    table.add_column("method", no_wrap=True)
    for col in ("measured", "±", "predicted", "error", "correct", "× plan"):
        # "×" alone atop "plan" would read as a column of the plan's own figures
        table.add_column(col, justify="left" if col == "correct" else "right", no_wrap=col == "× plan")
    plan_rows = frame.loc[frame["method"] == "plan", "measured_median_us"]
    plan_us = plan_rows.iloc[0] if len(plan_rows) else None  # none where a signal stopped it before its first run
    for r in frame.itertuples():
        mark = "[green]yes[/]" if r.correct else "[bold red]NO[/]"
        table.add_row(
            r.method,
            _us(r.measured_median_us),
            _us(r.spread_us / 2),
            _us(r.predicted_us),
            "—" if _missing(r.rel_error) else f"{r.rel_error:+.0%}",
            mark + ("" if _missing(r.max_rel_err) else f" {r.max_rel_err:.0e}"),
            "—" if plan_us is None else f"{r.measured_median_us / plan_us:.2f}",
        )
    con.print(table)
    con.print("± half the p10-p90 spread; error = measured / predicted - 1; correct with the max relative "
              "error against the reference (the rows give its tolerance). Rows: "
              + ("not written" if path is None else escape(str(path))))
    if plan_us is not None and (frame["method"] == first["algorithm"]).any():
        # A search may pick a baseline's method: its two rows differ only by the noise of the run.
        con.print(f"the plan is {escape(str(first['algorithm']))}: its baseline row runs the same method by the "
                  "baselines' own code, so the two rows differ by that code and the run's noise only")


# Methods whose ranks merge the same partials in different orders by design: their bits differ.
_DIFFER_BY_DESIGN = {
    "ring-attention": "each rank merges the ring's blocks in its own order, its own block first",
}


def _bits_lines(frame, plan) -> None:  # noqa: ANN001 - a DataFrame, a Plan
    """Say which methods' ranks ended with different bits (every rank holds the result): a note
    where the method merges in other orders on purpose, a warning elsewhere."""
    differ = [r.method for r in frame.itertuples() if r.same_bits is False]
    if not differ:
        return
    expected = dict(_DIFFER_BY_DESIGN)
    if "plan" in differ:
        from treeattn.plan.bits import bit_groups, split_text

        split = bit_groups(plan)
        if split:  # as ``treeattn verify`` says of it
            expected["plan"] = f"its ranks merge the same partials in other orders or groupings ({split_text(split)})"
    con = console()
    for method in differ:
        if method in expected:
            con.print(f"[cyan]note:[/] {escape(method)}'s ranks ended with different bits, as expected: "
                      f"{escape(expected[method])}")
    unexpected = [m for m in differ if m not in expected]
    if unexpected:
        con.print(f"[yellow]warning:[/] ranks ended with different bits (every rank holds the result): "
                  f"{escape(', '.join(unexpected))}")


def _missing(value) -> bool:  # noqa: ANN001 - a number, None or NaN
    return value is None or value != value


def _us(value) -> str:  # noqa: ANN001 - a number, None or NaN
    if _missing(value):
        return "—"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"
