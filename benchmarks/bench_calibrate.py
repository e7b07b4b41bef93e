"""Predicted vs measured after calibration: ping-pong at every size and every plan family.

1. ``treeattn.calibrate.live`` on ``cpu:ranks=P`` (gloo over loopback): ping-pong per route
   class at 13 sizes from 4 B to 64 MiB, with 1 and 4 round trips, concurrent-flow and fan-in
   tests, and the ``sum`` kernel (raw payloads are summed); fitted into the topology, the
   host CPU terms (``treeattn.calibrate.fit_host``) fitted to those calibration cases only.
2. Every builder family that reduces raw payloads, at 16 KB, 1 MB and 16 MB per rank, is run
   by the executor (``treeattn.exec``: every rank starts at one agreed instant; median over
   repeats of the time to the last rank's end) and predicted by ``treeattn.cost.simulate`` on
   the calibrated topology. The families are not part of the fit: they check it.
3. Prints the table of every case (measured median, predicted, relative error) and the median
   and p90 of the absolute relative errors; with ``--out-dir`` also writes the fitted topology,
   the calibration JSON, a CSV of every case, the fit's PNG and a README.md with the tables.

    .venv/bin/python benchmarks/bench_calibrate.py                  # every case (80 s here)
    .venv/bin/python benchmarks/bench_calibrate.py --realtime --out-dir results/calibration-cpu4
    .venv/bin/python benchmarks/bench_calibrate.py --quick          # fewer sizes and repeats

``--quick`` shortens the two calibrations and the plan runs: 25 s in all on 2 cores (2026-12-07;
1.5 min on the busier cores of an earlier run); ``--no-recalibrate`` skips the second.

``allreduce`` and ``allgather-merge`` are library collectives: the simulator times them as
the ring schedules gloo runs (``treeattn.cost.gloo``); they are shown, and summarized apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from treeattn.calibrate.live import CalibrateOptions, calibrate
from treeattn.calibrate.plot import plot_calibration
from treeattn.cli.paths import output_folder
from treeattn.cli.script import ArgumentParser, count, size_list
from treeattn.cli.script import run as run_script
from treeattn.cost.simulate import simulate
from treeattn.exec.launch import launch
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import ALGORITHMS, build
from treeattn.textfile import write_file
from treeattn.topology.io import dump_topology
from treeattn.topology.library import resolve
from treeattn.units import format_size
from treeattn.validate.run import realtime_priority
from treeattn.workload import RawPayload

LIBRARY = ("allreduce", "allgather-merge")
EXTRA = {"hierarchical": {"group_size": 2}}
SKIP = ("tree",)  # the generic parent-list form of star/chain/kary/binomial


def families() -> list[str]:
    return [name for name, spec in ALGORITHMS.items() if "raw" in spec.payloads and name not in SKIP]


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    return f"median {statistics.median(a):.1%}, p90 {quantile(a, 0.9):.1%} over {len(a)} cases" if a else "no cases"


def main() -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=count, default=4)
    ap.add_argument("--sizes", type=size_list, default="16KB,1MB,16MB", help="payload per rank of the plan families")
    ap.add_argument("--chunks", type=count, default=1)
    ap.add_argument("--repeats", type=count, default=21, help="timed iterations per plan")
    ap.add_argument("--warmup", type=lambda x: count(x, 0), default=3)
    ap.add_argument("--cal-repeats", type=count, default=15, help="timed iterations per calibration case")
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--no-recalibrate", dest="recalibrate", action="store_false",
                    help="skip the second calibration after the plan runs")
    ap.add_argument("--quick", action="store_true", help="6 calibration sizes up to 4 MiB, 3 repeats")
    ap.add_argument("--realtime", action="store_true",
                    help="run everything (the ranks too) under SCHED_RR, so other work on a shared host preempts "
                         "it less (root only; treeattn.validate.run.realtime_priority)")
    args = ap.parse_args()
    if args.out_dir is not None:  # checked before the minutes of measuring, not after
        args.out_dir = output_folder(args.out_dir, "--out-dir")
    with realtime_priority(args.realtime):
        run(args)


def run(args: argparse.Namespace) -> None:
    console = Console(width=140)
    p = args.ranks
    topo = resolve(f"cpu:ranks={p}")
    opt = CalibrateOptions(repeats=args.cal_repeats, compute="sum")
    if args.quick:
        opt = CalibrateOptions(max_bytes=4 << 20, sizes=6, repeats=3, warmup=1, compute="sum",
                               contention_sizes=(1 << 20,))
        args.repeats, args.warmup = 3, 1
    load = [os.getloadavg()[0]]
    t0 = time.time()
    report = calibrate(topo, opt)
    fitted = report.topology
    t_cal = time.time() - t0
    load.append(os.getloadavg()[0])
    plans = {}
    for n in args.sizes:
        for fam in families():
            plans[f"{fam}-{n}B"] = (fam, n, build(fam, RawPayload(nbytes=n, ranks=p), fitted, chunks=args.chunks,
                                                  **EXTRA.get(fam, {})))
    run_opts = RunOptions(repeats=args.repeats, warmup=args.warmup, timeout_s=120, setup_timeout_s=600,
                          backend="gloo")
    t0 = time.time()
    result = launch(Job(tuple(PlanJob(label, plan) for label, (_, _, plan) in plans.items()), run_opts))
    t_run = time.time() - t0
    load.append(os.getloadavg()[0])
    # A second calibration right after the plans: how far the machine drifted meanwhile.
    after = calibrate(topo, opt) if args.recalibrate else None
    load.append(os.getloadavg()[0])
    def row(case, n, flows, trips, measured, spread, pred, correct=True, after_us=None) -> dict:  # noqa: ANN001
        out = {"case": case, "size_bytes": n, "flows": flows, "round_trips": trips, "measured_us": measured,
               "spread_us": spread, "predicted_us": pred, "rel_error": (pred - measured) / measured,
               "correct": correct}
        if after_us is not None:
            out["predicted_after_us"] = after_us
        return out

    rows = []
    for m in result.measurements:
        fam, n, plan = plans[m.label]
        pred = simulate(plan, fitted, timeline=False).predicted_us
        pa = simulate(plan, after.topology, timeline=False).predicted_us if after is not None else None
        rows.append(row(fam, n, None, None, m.median_us, m.spread_us, pred, m.correct, pa))
    pp = [row("pingpong", c.nbytes, c.flows, c.round_trips, c.measured_us, c.spread_us, c.predicted_us)
          for c in report.cases if c.kind == "pingpong"]
    other = [row(c.kind, c.nbytes, c.flows, c.round_trips, c.measured_us, c.spread_us, c.predicted_us)
             for c in report.cases if c.kind != "pingpong"]
    command = " ".join([".venv/bin/python", *sys.argv])
    lines = render(console, report, after, rows, pp, other, load, t_cal, t_run, command, args)
    if args.out_dir is not None:
        write(args.out_dir, report, fitted, rows + pp + other, lines)


def _params(report) -> list[str]:  # noqa: ANN001 - a CalibrationReport
    c = report.classes[0]
    cost = report.topology.cost
    ln = report.topology.links[0]
    h = report.host
    host = (f"- host terms (fitted to all {h.cases} calibration cases through the simulator, {h.evaluations} "
            f"evaluations, rms log error {h.rms_log_error:.3f}): host_cores = {h.cores}, cpu_us = {h.cpu_us:.1f} "
            f"per message end, wakeup_us = {h.wakeup_us:.0f}, start_cpu_us = {h.start_cpu_us:.0f}, cpu_us_per_kb = "
            f"{h.cpu_us_per_kb:.2f}, coll_cpu_us = {h.coll_cpu_us or 0:.1f}, loopback: one flow "
            f"{ln.flow_cap_gbps:.3g} GB/s, all flows together {ln.bw_gbps:.3g} GB/s, latency_us = "
            f"{ln.latency_us:.1f}" if h else
            f"- overhead_us = {cost.overhead_us:.1f}, link latency_us = {ln.latency_us:.1f}, bw_gbps = "
            f"{ln.bw_gbps:.3g}")
    return [f"- ping-pong fit, loopback class, pair {c.route_class.pair}: α = {c.fit.alpha_us:.1f} µs per "
            f"message, β = {c.fit.beta_gbps:.3g} GB/s, per-iteration term {c.fit.skew_us:.0f} µs; "
            f"R² = {c.fit.r2:.4f}", host,
            f"- compute ({report.compute.kernel} kernel): launch_us = {cost.launch_us:.1f}, mem_efficiency = "
            f"{cost.mem_efficiency:.3g} (effective {report.compute.eff_bw_gbps:.3g} GB/s)" if report.compute else ""]


def _err(r: dict, key: str) -> float:
    return (r[key] - r["measured_us"]) / r["measured_us"]


def render(console: Console, report, after, rows, pp, other, load, t_cal, t_run, command, args) -> list[str]:  # noqa: ANN001
    """Print the tables; return the same as Markdown lines for the README."""
    md = [f"Command: `{command}`", "",
          f"Machine: {os.cpu_count()} CPU cores, {args.ranks} ranks (processes), gloo over TCP loopback"
          f"{', every process under SCHED_RR (--realtime)' if args.realtime else ''}. "
          f"Load average (1 min) before calibration {load[0]:.1f}, after it {load[1]:.1f}, after the plan runs "
          f"{load[2]:.1f}{f', after the second calibration {load[3]:.1f}' if after is not None else ''}. "
          f"Calibration {t_cal:.0f} s, plan runs "
          f"{t_run:.0f} s.", "",
          "## Fitted parameters (calibration before the plan runs: the one predictions use)", "", *_params(report), ""]
    if after is not None:
        md += ["Second calibration, right after the plan runs (machine drift; column 'pred. after'):", "",
               *_params(after), ""]
    md += ["Columns: *predicted* is `treeattn.cost.simulate` on the calibrated topology (the figure the issue "
           "asks for); *± µs* is half the p10-p90 spread of the iterations. The plan families are not part of "
           "the fit.", ""]
    for title, data in ((f"Plan families (raw payloads, chunks={args.chunks})", rows),
                        ("Ping-pong (calibration cases, every size)", pp),
                        ("Concurrent flows, fan-in and library all-reduces (calibration cases)", other)):
        table = Table(title=title)
        extra = "predicted_after_us" in data[0]
        head = ("case", "size", "flows", "R", "measured µs", "± µs", "predicted µs", "error")
        head += ("pred. after µs", "error after") if extra else ()
        for col in head:
            table.add_column(col, justify="left" if col == "case" else "right")
        md += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in data:
            cells = (r["case"], format_size(r["size_bytes"]), "" if r["flows"] is None else str(r["flows"]),
                     "" if r["round_trips"] is None else str(r["round_trips"]), f"{r['measured_us']:,.0f}",
                     f"{r['spread_us'] / 2:,.0f}", f"{r['predicted_us']:,.0f}", f"{r['rel_error']:+.1%}")
            if extra:
                pa = r["predicted_after_us"]
                cells += (f"{pa:,.0f}", f"{(pa - r['measured_us']) / r['measured_us']:+.1%}")
            table.add_row(*cells)
            md.append("| " + " | ".join(cells) + " |")
        console.print(table)
        md.append("")
    p2p = [r["rel_error"] for r in rows if r["case"] not in LIBRARY]
    lib = [r["rel_error"] for r in rows if r["case"] in LIBRARY]
    ppe = [r["rel_error"] for r in pp]
    after_p2p = [_err(r, "predicted_after_us") for r in rows if "predicted_after_us" in r and r["case"] not in LIBRARY]
    cal = [r["rel_error"] for r in other]
    lines = [
        f"plan families, point-to-point: {summary(p2p)}",
        f"plan families, library collectives ({', '.join(LIBRARY)}): {summary(lib)}",
        f"plan families, all: {summary(p2p + lib)}",
        f"ping-pong: {summary(ppe)}",
        f"ping-pong + point-to-point families: {summary(ppe + p2p)}",
        f"everything above: {summary(ppe + p2p + lib)}",
        f"concurrent flows, fan-in and library all-reduces (calibration cases): {summary(cal)}",
    ]
    if after_p2p:
        lines.append(f"analysis, point-to-point families predicted with the second calibration: {summary(after_p2p)}")
    wrong = [r["case"] for r in rows if not r["correct"]]
    if wrong:
        lines.append(f"WRONG RESULTS: {wrong}")
    md += ["## Absolute relative error |predicted - measured| / measured", ""] + [f"- {x}" for x in lines] + [""]
    for x in lines:
        console.print(x)
    console.print(f"load average {' / '.join(f'{x:.1f}' for x in load[:4 if after is not None else 3])}; "
                  f"command: {command}")
    return md


def write(out: Path, report, fitted, rows, md) -> None:  # noqa: ANN001
    out.mkdir(parents=True, exist_ok=True)
    write_file(out / "cpu-calibrated.yaml", dump_topology(fitted))
    write_file(out / "calibration.json", json.dumps(report.to_dict(), sort_keys=True, indent=2) + "\n")
    head = ("case", "size_bytes", "flows", "round_trips", "measured_us", "spread_us", "predicted_us", "rel_error",
            "predicted_after_us")

    def cell(v) -> str:  # noqa: ANN001 - a number, text or None
        return "" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)

    csv = [",".join(head)] + [",".join(cell(r.get(k)) for k in head) for r in rows]
    write_file(out / "cases.csv", "\n".join(csv) + "\n")
    plot_calibration(report, out / "fit.png")
    title = ["# Calibration on this machine: predicted vs measured", "",
             "Written by `benchmarks/bench_calibrate.py` (see its docstring for what runs)."
             + (" What these figures show and why: [FINDINGS.md](FINDINGS.md)." if (out / "FINDINGS.md").exists()
                else ""), ""]
    write_file(out / "README.md", "\n".join(title + md) + "\n")


if __name__ == "__main__":
    sys.exit(run_script(main))
