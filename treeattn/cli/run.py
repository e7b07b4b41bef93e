"""``treeattn run PLAN``: execute a plan on real ranks, check it, time it, compare with the prediction."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from treeattn.cli import app, err_console
from treeattn.cli.options import BackendOpt, JsonOpt, MeasureOrder, OrderOpt
from treeattn.errors import ExecutionError, InputError

__all__ = ["run"]


class CheckMode(StrEnum):
    """Which ranks compare their result with the single-process reference."""

    ROOT = "root"
    ALL = "all"


def _load(path: Path):  # noqa: ANN202 - a Plan
    try:
        from treeattn.plan.io import load_plan
    except ImportError:
        raise InputError("this treeattn has no plan file reader (treeattn.plan.io)") from None
    from treeattn.plan.validate import check

    plan = load_plan(path)
    check(plan)
    return plan


@app.command("run")
def run(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", exists=True, dir_okay=False,
                                              help="Plan file (from treeattn plan).")],
    baselines: Annotated[bool, typer.Option("--baselines", help="Also run the methods it competes with for its "
                                            "result layout (all: all-reduce x3 and x2, all-gather + merge; heads: "
                                            "reduce-scatter, vLLM's decode context parallel; ring attention "
                                            "always) on the same workload.")] = False,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timed iterations per method.")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed iterations first.")] = 2,
    order: OrderOpt = MeasureOrder.INTERLEAVED,
    timeout: Annotated[float, typer.Option("--timeout", min=0.001, help="Seconds one operation may wait "
                                           "before its rank gives up (NCCL too: a rank that dies or hangs "
                                           "stops every rank within it).")] = 5.0,
    graph: Annotated[bool | None, typer.Option("--graph/--no-graph", help="Replay each method from a CUDA graph "
                                               "after its warm-up (NCCL; default: on with NCCL, falling back to "
                                               "eager with one line saying why when capture fails).")] = None,
    backend: BackendOpt = None,
    check: Annotated[CheckMode, typer.Option("--check", help="root: the result rank checks; all: every "
                                             "result rank.")] = CheckMode.ROOT,
    seed: Annotated[int, typer.Option("--seed", help="Seed of q, K and V.")] = 0,
    topology: Annotated[str | None, typer.Option("--topology", "-t", help="Topology (preset or file) to "
                                                 "predict on; default: the plan's.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="CSV to append rows to; default "
                                             "results/runs/<run-id>.csv.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run PLAN on its ranks (local processes, or those of torchrun/SLURM), check the result
    against a single-process reference and compare the measured time with the prediction."""
    from treeattn.exec.launch import detect_env, launch
    from treeattn.exec.predict import plan_baselines, predict, resolve_topology
    from treeattn.exec.results import new_run_id
    from treeattn.exec.runner import Job, PlanJob, RunOptions

    plan = _load(plan_file)
    options = RunOptions(repeats=repeats, warmup=warmup, timeout_s=timeout,
                         backend=backend.value if backend else None, check=check.value, seed=seed,
                         baselines=baselines, order=order.value, graph=graph)
    placed = detect_env()
    reporter = placed is None or placed.rank == 0
    topo, warnings = resolve_topology(plan, topology)
    methods, ring = plan_baselines(plan, topo)
    predictions = predict(plan, topo, methods if baselines else ()) if reporter else None
    label = plan_file.name
    result = launch(Job((PlanJob(label, plan, ring_order=ring),), options))
    if result is None or predictions is None:
        return
    for text in (*warnings, *predictions.warnings):
        err_console.print(f"[yellow]warning:[/] {escape(text)}")
    kernels = sorted({m.kernel for m in result.measurements if m.kernel != "none"})
    err_console.print(f"{result.backend} on {result.device}: attention kernel {', '.join(kernels) or 'none'}, "
                      f"merges {result.merge}, CUDA graphs {'on' if result.graphs else 'off'}")
    emit_results(result, plan, label, predictions, new_run_id(plan_file.stem), out, json_out)


def emit_results(result, plan, label: str, predictions, run_id: str, out: Path | None,  # noqa: ANN001
                 json_out: bool) -> None:
    """Write a run's rows and timeline (``results/runs/`` unless ``out``), print them as a
    table or JSON, and fail loudly (exit 1) when any method's result was wrong."""
    from treeattn.exec.results import result_rows, rows_json, timeline_rows, write_csv

    frame = result_rows(result, {label: plan}, {label: predictions}, run_id)
    path = out if out is not None else Path("results") / "runs" / f"{run_id}.csv"
    write_csv(frame, path)
    write_csv(timeline_rows(result, run_id), path.with_name(path.stem + ".timeline.csv"))
    if json_out:
        typer.echo(rows_json(frame))
    else:
        _table(frame, path)
    wrong = frame[~frame["correct"]]
    if len(wrong):
        worst = ", ".join(f"{r.method} (max relative error {r.max_rel_err})" for r in wrong.itertuples())
        raise ExecutionError(f"wrong result from {worst} on {label}; see {path}")


def _table(frame, path: Path) -> None:  # noqa: ANN001 - a DataFrame
    console = Console(highlight=False)
    first = frame.iloc[0]
    table = Table(title=f"{first['plan']} · {first['algorithm']} · {first['workload']} · {first['ranks']} ranks "
                  f"({first['backend']}, predicted on {first['topology']}) · µs")
    table.add_column("method", no_wrap=True)
    for col in ("measured", "±", "predicted", "error", "correct", "× plan"):
        table.add_column(col, justify="left" if col == "correct" else "right")
    plan_us = frame.loc[frame["method"] == "plan", "measured_median_us"].iloc[0]
    for r in frame.itertuples():
        mark = "[green]yes[/]" if r.correct else "[bold red]NO[/]"
        table.add_row(
            r.method,
            _us(r.measured_median_us),
            _us(r.spread_us / 2),
            _us(r.predicted_us),
            "—" if _missing(r.rel_error) else f"{r.rel_error:+.0%}",
            mark + ("" if _missing(r.max_rel_err) else f" {r.max_rel_err:.0e}"),
            f"{r.measured_median_us / plan_us:.2f}",
        )
    console.print(table)
    console.print(f"± half the p10-p90 spread; error = measured / predicted - 1; correct with the max relative "
                  f"error against the reference. Rows: {path}")


def _missing(value) -> bool:  # noqa: ANN001 - a number, None or NaN
    return value is None or value != value


def _us(value) -> str:  # noqa: ANN001 - a number, None or NaN
    if _missing(value):
        return "—"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"
