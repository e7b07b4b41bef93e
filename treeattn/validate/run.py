"""Validate the planner on emulated clusters: measure every candidate and baseline, predict each.

For each topology, inside one emulated cluster (brought up, or reused when one is up):

1. calibrate (``treeattn calibrate`` inside the namespaces), unless told not to or given a
   fitted topology: plans are made for, and times predicted on, the fitted topology;
2. per case, the best plan of every candidate family and the pick (``methods.case_plans``);
3. one executor job with every plan of every case, the baselines once per case
   (``RunOptions(baselines=True)``): gloo, one rank per namespace;
4. per measured method, the simulator's prediction (baselines: the builders' plans of
   ``allreduce3``, ``allgather-merge`` and ``ring-attention``), and the simulator's and the
   executor's per-rank timelines of the picks.

Rows go to ``OUT/rows.csv`` after each topology (``treeattn.report.folder`` documents the
folder), so an interrupted run keeps what it finished.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

from treeattn.cost.simulate import SimResult, simulate
from treeattn.errors import EmulationError, InputError
from treeattn.exec.deadline import MAX_ITERATIONS, SETUP_TIMEOUT_S, check_iterations
from treeattn.plan.baselines import Baseline, baselines_for
from treeattn.plan.builders import build
from treeattn.plan.ir import Plan, TopologyRef
from treeattn.report.folder import META_FILE, ROW_COLUMNS, ROWS_FILE, TIMELINE_COLUMNS, TIMELINE_FILE
from treeattn.search.rings import ring_order
from treeattn.search.search import FAMILIES
from treeattn.textfile import write_file
from treeattn.topology.io import dump_topology
from treeattn.topology.model import Topology
from treeattn.validate.calibration import Calibration, CalibrationSettings, calibrate_in_cluster
from treeattn.validate.cases import CaseSpec, default_cases
from treeattn.validate.methods import CasePlans, case_plans

__all__ = ["MAX_ROUNDS_FACTOR", "ValidateOptions", "case_rounds", "TopologyTarget", "TopologyRun",
           "validate", "validate_topology", "wait_for_quiet", "realtime_priority", "REALTIME_PRIORITY"]

MAX_ROUNDS_FACTOR = 10
"""At most this many times ``repeats`` rounds for a cheap case (``ValidateOptions.case_seconds``)."""

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ValidateOptions:
    """How ``validate`` measures (the flags of ``treeattn validate``)."""

    repeats: int = 15
    """Timed rounds of every case (medians). Fewer leave the regret to chance on a small host:
    one plan's iterations there spread 20-30 % either way."""
    case_seconds: float = 10.0
    """Cheap cases get more rounds: as many as their methods' predicted times fit in this many
    seconds, up to ``MAX_ROUNDS_FACTOR`` times ``repeats`` and at most
    ``treeattn.exec.deadline.MAX_ITERATIONS`` (0: ``repeats`` for every case)."""
    warmup: int = 1
    scale: float = 1.0
    """Factor on every emulated link's bandwidth."""
    seed: int = 0
    """Seed of the search and of q, K, V."""
    op_timeout_s: float = 300.0
    """Deadline of one measured operation (a ring-attention step moves megabytes)."""
    job_timeout_s: float = 3600.0
    """Deadline of one topology's whole job."""
    calibrate: bool = True
    calibration: CalibrationSettings = field(default_factory=CalibrationSettings)
    families: tuple[str, ...] | None = None
    """Candidate families measured (default: all of ``treeattn.search.FAMILIES``)."""
    reuse: bool = True
    """Use an emulated cluster already up for the topology (left up)."""
    timelines: str = "picks"
    """Timelines saved: ``picks``, ``all`` plans, or ``none``."""
    max_load: float | None = None
    """Before calibrating and before measuring, wait until the 1-minute load average is at most
    this (the emulated ranks share the host's cores with everything else running)."""
    max_wait_s: float = 600.0
    """How long to wait for ``max_load`` before measuring anyway (the metadata says so)."""
    order: str = "interleaved"
    """Order of the timed runs (``treeattn.exec.runner.RunOptions.order``)."""
    realtime: bool = False
    """Run calibration and measurement ranks under ``SCHED_RR`` (priority ``REALTIME_PRIORITY``),
    so that other work on the host does not delay their wake-ups: on a loaded 2-core host a
    2-rank 4-byte exchange measured 3.6 ms median at normal priority and 0.25 ms under
    ``SCHED_RR``. Needs root; the kernel's RT throttling still leaves others 5 % of the CPU."""

    def __post_init__(self) -> None:
        check_iterations(self.repeats, self.warmup)
        if not self.case_seconds >= 0:
            raise InputError(f"case seconds must be >= 0, got {self.case_seconds}")
        if self.timelines not in ("picks", "all", "none"):
            raise InputError(f"timelines must be picks, all or none, got {self.timelines!r}")
        if not self.scale > 0:
            raise InputError(f"scale must be > 0, got {self.scale}")
        unknown = sorted(set(self.families or ()) - set(FAMILIES))
        if unknown:
            raise InputError(f"unknown candidate families {unknown}; choose from {', '.join(FAMILIES)}")


@dataclass(frozen=True)
class TopologyTarget:
    """One topology to validate: what to emulate, its cases, and optionally a fitted copy."""

    topology: Topology
    """The emulated topology at scale 1 (``topologies/emu-*.yaml``)."""
    cases: tuple[CaseSpec, ...] = ()
    """Default: ``default_cases(topology)``."""
    calibrated: Topology | None = None
    """Plan and predict on this instead of calibrating (a ``treeattn calibrate -o`` file)."""
    source: str = ""
    """What the user named it by (file or preset), for the metadata."""


@dataclass(frozen=True)
class TopologyRun:
    """What one topology gave."""

    name: str
    rows: pd.DataFrame
    timeline: pd.DataFrame
    meta: dict
    predicted_on: Topology
    """The topology plans were made for and predicted on (the fitted one after calibration)."""


def _pct(values: list[float], q: float) -> float:
    ts = sorted(values)
    pos = q * (len(ts) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ts) - 1)
    return ts[lo] + (ts[hi] - ts[lo]) * (pos - lo)


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


REALTIME_PRIORITY = 10


@contextlib.contextmanager
def realtime_priority(enabled: bool) -> Iterator[None]:
    """While inside, this process (and every process it starts) runs under ``SCHED_RR``.

    Raises:
        EmulationError: the scheduler refused (not root, or no CAP_SYS_NICE).
    """
    if not enabled:
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(REALTIME_PRIORITY))
    except OSError as exc:
        raise EmulationError(f"--realtime: cannot switch to SCHED_RR ({exc.strerror or exc}); run as root or drop "
                             "--realtime") from None
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


def wait_for_quiet(max_load: float | None, max_wait_s: float, say: Progress) -> dict:
    """Wait until the 1-minute load average is at most ``max_load`` (None: do not wait).

    Returns:
        ``{"load": load when done waiting, "waited_s": seconds, "quiet": reached}``.
    """
    t0 = time.monotonic()
    load = os.getloadavg()[0]
    if max_load is None:
        return {"load": round(load, 2), "waited_s": 0.0, "quiet": None}
    told = False
    while load > max_load and time.monotonic() - t0 < max_wait_s:
        if not told:
            say(f"load average {load:.1f} > {max_load:g}: waiting up to {max_wait_s:.0f} s for a quieter host")
            told = True
        time.sleep(5.0)
        load = os.getloadavg()[0]
    return {"load": round(load, 2), "waited_s": round(time.monotonic() - t0, 1), "quiet": load <= max_load}


_PROC_STAT = Path("/proc/stat")


def cpu_ticks() -> list[int] | None:
    """The host's CPU time so far, in ticks by state (the ``cpu`` line of ``/proc/stat``:
    user, nice, system, idle, iowait, irq, softirq, steal); None where there is none."""
    try:
        first = _PROC_STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if len(first) < 9 or first[0] != "cpu":
        return None
    return [int(x) for x in first[1:9]]


def cpu_shares(before: list[int] | None, after: list[int] | None) -> dict | None:
    """What the host's CPUs did between two ``cpu_ticks`` readings, as shares of all CPU time:
    ``steal`` (taken by the hypervisor for other guests: the ranks simply did not run),
    ``softirq`` (the kernel's packet processing, which the emulated links' traffic costs) and
    ``busy`` (everything but idle). A noisy measurement shows here first."""
    if before is None or after is None:
        return None
    d = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(d)
    if total <= 0:
        return None
    return {"steal": round(d[7] / total, 3), "softirq": round(d[6] / total, 3),
            "busy": round(1.0 - (d[3] + d[4]) / total, 3)}


def _predict(plan: Plan, topo: Topology, timeline: bool = False) -> SimResult:
    return simulate(plan, topo, timeline=timeline)


def _case_baselines(case: CaseSpec, topo: Topology) -> tuple[list[Baseline], tuple[int, ...]]:
    """The baselines the runner measures beside a case's plans (its layout's), and the ring."""
    ring = tuple(ring_order(topo)[1])
    return baselines_for(case.workload, case.result, None, ring), ring


def case_rounds(options: ValidateOptions, round_us: float) -> int:
    """Timed rounds of a case whose methods take ``round_us`` a round (predicted): ``repeats``,
    or more while they fit in ``case_seconds``, up to ``MAX_ROUNDS_FACTOR`` times ``repeats`` and
    never past ``MAX_ITERATIONS`` (the runner refuses more, and only once the ranks are up)."""
    if options.case_seconds <= 0 or not round_us > 0:
        return options.repeats
    fit = int(options.case_seconds * 1e6 // round_us)
    return max(options.repeats, min(fit, MAX_ROUNDS_FACTOR * options.repeats, MAX_ITERATIONS))


def _row(topo_name: str, case: CaseSpec, method: str, role: str, is_pick: bool, plan: Plan, m,  # noqa: ANN001
         predicted: float | None, nominal: float | None) -> dict:
    w = case.workload
    times = list(m.times_us)
    return {
        "topology": topo_name, "case": case.name, "regime": case.regime, "ranks": w.ranks, "batch": w.batch,
        "q_heads": w.q_heads, "kv_heads": w.kv_heads, "head_dim": w.head_dim, "tokens_per_rank": case.tokens_per_rank,
        "payload_bytes": w.payload_bytes, "kv_bytes_per_rank": w.kv_bytes(0), "method": method, "role": role,
        "is_pick": is_pick, "algorithm": plan.algorithm, "chunks": plan.chunks,
        "predicted_us": _round(predicted), "predicted_nominal_us": _round(nominal),
        "measured_median_us": _round(m.median_us), "measured_p10_us": _round(_pct(times, 0.1)),
        "measured_p90_us": _round(_pct(times, 0.9)), "repeats": len(times), "correct": bool(m.correct),
        "max_rel_err": float(f"{m.max_rel_err:.3e}") if math.isfinite(m.max_rel_err) else None,
        "measured_times_us": " ".join(f"{t:.1f}" for t in times),
    }


def _timeline_rows(topo_name: str, case: str, method: str, sim, measured) -> list[dict]:  # noqa: ANN001
    out = []
    for t in sim.timeline or ():
        out.append({"topology": topo_name, "case": case, "method": method, "source": "predicted", "rank": t.rank,
                    "op_index": t.op, "kind": t.kind, "peer": t.peer, "chunk": t.chunk,
                    "start_us": round(t.start_us, 3), "end_us": round(t.end_us, 3)})
    for t in sorted(measured, key=lambda t: (t.rank, t.index)):
        out.append({"topology": topo_name, "case": case, "method": method, "source": "measured", "rank": t.rank,
                    "op_index": t.index, "kind": t.op.kind.value, "peer": t.op.peer, "chunk": t.op.chunk,
                    "start_us": round(t.post_us, 3), "end_us": round(t.done_us, 3)})
    return out


def validate_topology(target: TopologyTarget, options: ValidateOptions | None = None,
                      progress: Progress | None = None) -> TopologyRun:
    """Calibrate, plan, measure and predict every case of one emulated topology.

    Args:
        target: the topology, its cases and optionally a fitted copy.
        options: repeats, scale, calibration, families.
        progress: called with one line per stage.

    Returns:
        The rows (``ROW_COLUMNS``), the timelines and this topology's metadata.

    Raises:
        EmulationError: no root or iproute2, or the cluster cannot be built.
        ExecutionError: a rank failed.
        InputError: bad cases or families.
    """
    from treeattn.emulate import emulated
    from treeattn.emulate.jobs import launch_in_cluster
    from treeattn.emulate.layout import scaled_topology
    from treeattn.exec.runner import Job, PlanJob, RunOptions

    opt = options or ValidateOptions()
    say = progress or (lambda _line: None)
    topo = target.topology
    cases = target.cases or tuple(default_cases(topo))
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise InputError(f"case names on {topo.name!r} must differ, got {names}")
    emulated_topo = scaled_topology(topo, opt.scale)
    load0 = os.getloadavg()
    t0 = time.monotonic()
    quiet: dict[str, dict] = {}
    host_cpu: dict[str, dict | None] = {}
    with emulated(topo, scale=opt.scale, reuse=opt.reuse) as cluster:
        calib: Calibration | None = None
        if target.calibrated is not None:
            predict_on = target.calibrated
            source = "given"
        elif opt.calibrate:
            quiet["calibration"] = wait_for_quiet(opt.max_load, opt.max_wait_s, say)
            say(f"{topo.name}: calibrating inside the emulation ({cluster.num_ranks} ranks)")
            ticks = cpu_ticks()
            with realtime_priority(opt.realtime):
                # Time the attention kernel with the heads the cases plan (the bytes a KV byte
                # costs depend on them); the cases of one topology share them.
                w = cases[0].workload
                settings = replace(opt.calibration, attention_heads=(w.q_heads, w.kv_heads, w.head_dim))
                calib = calibrate_in_cluster(cluster, emulated_topo, settings)
            host_cpu["calibration"] = cpu_shares(ticks, cpu_ticks())
            predict_on = calib.topology
            source = "treeattn calibrate inside the emulation"
        else:
            predict_on = emulated_topo
            source = "none: the topology file's figures"
        if predict_on.num_ranks != topo.num_ranks:
            raise InputError(f"the calibrated topology {predict_on.name!r} places {predict_on.num_ranks} ranks, "
                             f"{topo.name!r} {topo.num_ranks}")
        planned: dict[str, CasePlans] = {}
        baselines: dict[tuple[str, str], tuple[Plan, SimResult]] = {}  # (case, baseline): plan, prediction
        jobs = []
        for case in cases:
            say(f"{topo.name}: planning {case.name}")
            cp = case_plans(predict_on, case.workload, families=opt.families, seed=opt.seed, result=case.result)
            planned[case.name] = cp
            methods, ring = _case_baselines(case, predict_on)
            for b in methods:
                plan = build(b.name, case.workload, TopologyRef.of(predict_on), **b.kwargs)
                baselines[case.name, b.name] = plan, _predict(plan, predict_on)
            round_us = (sum(m.plan.predicted_us or 0.0 for m in cp.methods)
                        + sum(baselines[case.name, b.name][1].predicted_us for b in methods))
            rounds = case_rounds(opt, round_us)
            jobs += [PlanJob(f"{case.name}|{m.method}", m.plan, rounds, ring) for m in cp.methods]
        run_opts = RunOptions(repeats=opt.repeats, warmup=opt.warmup, timeout_s=opt.op_timeout_s,
                              setup_timeout_s=max(SETUP_TIMEOUT_S, opt.op_timeout_s), backend="gloo", seed=opt.seed,
                              baselines=True, order=opt.order)
        quiet["measurement"] = wait_for_quiet(opt.max_load, opt.max_wait_s, say)
        say(f"{topo.name}: measuring {len(jobs)} plans and their baselines over {len(cases)} cases")
        ticks = cpu_ticks()
        with realtime_priority(opt.realtime):
            result = launch_in_cluster(cluster, Job(tuple(jobs), run_opts), timeout_s=opt.job_timeout_s)
        host_cpu["measurement"] = cpu_shares(ticks, cpu_ticks())
    wall = time.monotonic() - t0
    say(f"{topo.name}: predicting")
    by_case = {c.name: c for c in cases}
    rows: list[dict] = []
    timeline: list[dict] = []
    for m in result.measurements:
        case_name, method = m.label.split("|", 1)
        case = by_case[case_name]
        if m.method == "plan":
            mp = next(x for x in planned[case_name].methods if x.method == method)
            plan, name, role, pick = mp.plan, method, "candidate", mp.is_pick
            keep = opt.timelines == "all" or (opt.timelines == "picks" and pick)
            sim = _predict(plan, predict_on, timeline=keep)
        else:
            (plan, sim), name, role, pick, keep = baselines[case_name, m.method], m.method, "baseline", False, False
        nominal = sim.predicted_us if predict_on is emulated_topo else _predict(plan, emulated_topo).predicted_us
        rows.append(_row(topo.name, case, name, role, pick, plan, m, sim.predicted_us, nominal))
        if keep:
            timeline += _timeline_rows(topo.name, case_name, name, sim, m.timeline)
    meta = {
        "name": topo.name,
        "source": target.source,
        "fingerprint": topo.fingerprint,
        "scale": opt.scale,
        "ranks": topo.num_ranks,
        "predicted_on": {"name": predict_on.name, "fingerprint": predict_on.fingerprint,
                         "cost": asdict(predict_on.cost), "calibration": source},
        "calibration": calib.summary() if calib is not None else None,
        "cases": [{"name": c.name, "regime": c.regime, **c.workload.to_dict(),
                   "tokens_per_rank": c.tokens_per_rank} for c in cases],
        "skipped_families": {c: list(p.skipped) for c, p in planned.items() if p.skipped},
        "load_avg_before": [round(x, 2) for x in load0],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(wall, 1),
        "quiet": quiet,
        "host_cpu": host_cpu,
    }
    return TopologyRun(topo.name, pd.DataFrame(rows, columns=list(ROW_COLUMNS)),
                       pd.DataFrame(timeline, columns=list(TIMELINE_COLUMNS)), meta, predict_on)


def validate(targets: Sequence[TopologyTarget], out: str | Path, options: ValidateOptions | None = None, *,
             command: str = "", progress: Progress | None = None) -> list[TopologyRun]:
    """Validate every target in turn and write the results folder ``out``.

    Args:
        targets: topologies to emulate (the first is the primary one: the report's
            case-level targets are taken on it).
        out: the results folder (created; ``rows.csv``, ``timeline.csv``, ``meta.json``,
            ``calibration/<topology>.yaml`` are replaced).
        options: how to measure.
        command: the command line that ran, for ``meta.json``.
        progress: called with one line per stage.

    Returns:
        One ``TopologyRun`` per target.
    """
    if not targets:
        raise InputError("give at least one topology to validate")
    opt = options or ValidateOptions()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    runs: list[TopologyRun] = []
    meta = {
        "command": command,
        "primary_topology": targets[0].topology.name,
        "options": {**{k: v for k, v in asdict(opt).items() if k != "calibration"},
                    "calibration": asdict(opt.calibration)},
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "topologies": [],
    }
    for target in targets:
        run = validate_topology(target, opt, progress)
        runs.append(run)
        meta["topologies"].append(run.meta)
        if run.meta["calibration"] is not None:
            cal_dir = folder / "calibration"
            cal_dir.mkdir(exist_ok=True)
            write_file(cal_dir / f"{_stem(run.name)}.yaml", dump_topology(run.predicted_on))
        _write(folder, runs, meta)
    return runs


def _stem(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _write(folder: Path, runs: list[TopologyRun], meta: dict) -> None:
    rows = pd.concat([r.rows for r in runs], ignore_index=True)
    write_file(folder / ROWS_FILE, rows.to_csv(index=False))
    timeline = pd.concat([r.timeline for r in runs], ignore_index=True)
    write_file(folder / TIMELINE_FILE, timeline.to_csv(index=False))
    write_file(folder / META_FILE, json.dumps(meta, sort_keys=True, indent=2) + "\n")
