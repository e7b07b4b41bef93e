"""``treeattn calibrate``: measure this machine with real torch.distributed ranks and fit the
cost model's parameters (imports torch through ``treeattn.exec``).

What runs, in one launch of the topology's ranks (``treeattn.exec.launch``: local processes,
or those of torchrun/SLURM), every case timed by the executor exactly as ``treeattn run``
times a plan (barrier, then the plan; median over repeats of the maximum over ranks):

1. ping-pong plans between the representative pair of every route class
   (``plans.route_classes``), at log-spaced sizes, with 1 and more round trips;
2. concurrent-flow plans: disjoint pairs of one class ping-ponging at once, and a fan-in
   of several ranks into one, at a few sizes (do flows that share a link split it?);
3. with ``--compute attention``: every rank computing at once, and small attention plans
   (star, chain and binomial trees over all ranks, ``plans.tree_plans``);
4. ranks on host CPUs: two library all-reduces (gloo's own cost per message);

then, in this process, the executor's merge (or sum, or attention) kernel at those sizes.

Fits (``pingpong``): per class ``alpha_us``/``beta_gbps`` (and a per-iteration term);
the backend's per-message overhead from the sender-side completion times of the smallest
messages; ``launch_us`` and the effective memory bandwidth of the kernel. They are written
into a copy of the topology (``apply_fit``). When every rank is a process on this host's
CPUs, ``fit_host`` then fits the host terms (CPU time per message end and per step, wake-up,
loopback aggregate, and factors on the kernels' figures as they run amid the other ranks; the
cores are this machine's) to the cases through the simulator, in stages. On
the fitted topology the simulator predicts every plan that was measured: the report shows
predicted against measured for each.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

from treeattn.calibrate.apply_fit import ClassParams, FittedParams, apply_fit
from treeattn.calibrate.compute import (
    LAUNCH_BYTES,
    LLAMA_HEADS,
    MEMORY_BYTES,
    ComputeFit,
    kernel_fits,
    kv_bytes_per_token,
    measure_compute,
    poor_fit_note,
    rank_threads,
)
from treeattn.calibrate.fit_host import HostFit, fit_host_terms
from treeattn.calibrate.host_terms import on_host_cpus
from treeattn.calibrate.pingpong import PingPongFit, PingPongPoint, fit_pingpong, overhead_from_sends
from treeattn.calibrate.plans import (
    RouteClass,
    allreduce_plan,
    compute_plan,
    concurrent_plan,
    fanin_plan,
    log_sizes,
    pingpong_plan,
    route_classes,
    tree_plans,
)
from treeattn.cost.simulate import simulate
from treeattn.errors import ExecutionError, InputError, ProbeError
from treeattn.exec.deadline import SETUP_TIMEOUT_S, check_iterations
from treeattn.exec.launch import launch
from treeattn.exec.runner import Job, Measurement, PlanJob, Progress, RunOptions
from treeattn.plan.ir import OpKind, Plan, message_bytes
from treeattn.topology.families import this_machine_cores
from treeattn.topology.model import CALIBRATED_BY, Topology
from treeattn.units import format_size

__all__ = ["CalibrateOptions", "ClassResult", "CaseResult", "CalibrationReport", "calibrate", "calibration_plans",
           "median_abs_rel_error"]

_COMPUTE_KV_BYTES = (1 << 20, 16 << 20)
"""KV bytes per rank of the concurrent attention cases."""

_TREE_BATCHES = (2, 32)
_TREE_TOKENS = 48
"""Batches and KV tokens per rank of the small attention plans (tree cases)."""
_COLLECTIVE_BYTES = (64, 16 << 10)
"""Bytes per rank of the library all-reduce cases."""

_SMALL_BYTES = 1024
"""Messages up to this size time the sender's overhead."""


@dataclass(frozen=True, slots=True)
class CalibrateOptions:
    """What ``calibrate`` measures and how (the flags of ``treeattn calibrate``)."""

    min_bytes: int = 4
    max_bytes: int = 64 << 20
    sizes: int = 13
    """Log-spaced ping-pong sizes from ``min_bytes`` to ``max_bytes``."""
    round_trips: tuple[int, ...] = (1, 4)
    """Round-trip counts per size; two or more separate the per-iteration skew from alpha."""
    repeats: int = 10
    warmup: int = 2
    contention: bool = True
    contention_sizes: tuple[int, ...] = (16 << 10, 1 << 20, 16 << 20)
    """Concurrent-flow sizes (those outside min..max are dropped)."""
    compute: str = "merge"
    """Kernel whose fit sets ``launch_us``/``mem_efficiency``: sum, merge, attention, or none."""
    attention_heads: tuple[int, int, int] = LLAMA_HEADS
    """(q heads, KV heads, head dim) the attention kernel is timed with (``compute="attention"``)."""
    backend: str | None = None
    timeout_s: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_iterations(self.repeats, self.warmup)
        if not self.round_trips or min(self.round_trips) < 1:
            raise InputError(f"round trips must be >= 1, got {list(self.round_trips)}")
        if self.compute not in ("sum", "merge", "attention", "none"):
            raise InputError(f"unknown --compute {self.compute!r}; choose sum, merge, attention or none")
        # Every size is checked here, before anything is measured.
        log_sizes(self.min_bytes, self.max_bytes, self.sizes)
        for kernel in self.kernels():
            runs = [n for n in self.compute_sizes() if kernel_fits(kernel, n, self.attention_heads)]
            if len(runs) < 2:
                unit = "an attention token" if kernel == "attention" else f"a {kernel} row"
                raise InputError(f"--sizes {self.sizes}: {len(runs)} of the {kernel} kernel's sizes hold {unit} and "
                                 "its fit needs two; raise --sizes or --min-size")

    def kernels(self) -> tuple[str, ...]:
        """The compute kernels timed: merges and copies always pay the merge kernel's figures."""
        return () if self.compute == "none" else ("merge", "attention") if self.compute == "attention" \
            else (self.compute,)

    def compute_sizes(self) -> tuple[int, ...]:
        """Sizes the kernels are timed at: the ping-pong range widened to reach both the launch-
        and the memory-bound regime (a bandwidth fitted from launch-bound sizes alone is noise)."""
        return log_sizes(min(self.min_bytes, LAUNCH_BYTES), max(self.max_bytes, 4 * MEMORY_BYTES), self.sizes)


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One measured plan and the simulator's prediction for it on the fitted topology."""

    label: str
    kind: str
    """``pingpong``, ``concurrent``, ``fanin``, ``compute``, ``tree`` or ``collective``."""
    route_class: str
    nbytes: int
    flows: int
    """Pairs ping-ponging at once, or senders of a fan-in."""
    round_trips: int
    measured_us: float
    spread_us: float
    predicted_us: float
    measured_cpu_us: float | None = None
    """CPU time the ranks' processes used in one iteration, summed over ranks (median per rank)."""
    predicted_cpu_us: float | None = None
    """The CPU work the host model charges the ranks for one iteration (host ranks only)."""

    @property
    def rel_error(self) -> float:
        return (self.predicted_us - self.measured_us) / self.measured_us

    def to_dict(self) -> dict:
        out = {"label": self.label, "kind": self.kind, "route_class": self.route_class, "nbytes": self.nbytes,
               "flows": self.flows, "round_trips": self.round_trips, "measured_us": self.measured_us,
               "spread_us": self.spread_us, "predicted_us": self.predicted_us, "rel_error": self.rel_error}
        if self.measured_cpu_us is not None:
            out["measured_cpu_us"] = self.measured_cpu_us
        if self.predicted_cpu_us is not None:
            out["predicted_cpu_us"] = self.predicted_cpu_us
        return out


@dataclass(frozen=True, slots=True)
class ClassResult:
    """One route class: its ping-pong points and fit."""

    route_class: RouteClass
    points: tuple[PingPongPoint, ...]
    fit: PingPongFit

    def to_dict(self) -> dict:
        c = self.route_class
        return {
            "name": c.name, "hops": [list(h) for h in c.hops], "pair": list(c.pair), "pairs": len(c.pairs),
            **self.fit.to_dict(),
            "points": [{"nbytes": p.nbytes, "round_trips": p.round_trips, "median_us": p.median_us,
                        "spread_us": p.spread_us, "setup_us": p.setup_us,
                        "fitted_us": self.fit.predict_us(p.nbytes, p.round_trips, p.setup_us)} for p in self.points],
        }


@dataclass(frozen=True)
class CalibrationReport:
    """What ``calibrate`` measured, fitted and predicted."""

    topology: Topology
    """The fitted topology."""
    measured_on: str
    """Name of the topology whose ranks ran."""
    backend: str
    classes: tuple[ClassResult, ...]
    overhead_us: float
    compute: ComputeFit | None
    """The merge (or sum) kernel: what merges and copies cost."""
    attention: ComputeFit | None
    """The attention kernel the runs use, when ``--compute attention``."""
    host: HostFit | None
    """The host CPU terms, when every rank runs on this host's CPUs."""
    cases: tuple[CaseResult, ...]
    options: CalibrateOptions
    load_avg: tuple[float, float]
    """1-minute load average before and after the measurements."""
    warnings: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        cost = self.topology.cost
        return {
            "topology": self.topology.name,
            "fingerprint": self.topology.fingerprint,
            "measured_on": self.measured_on,
            "backend": self.backend,
            "ranks": self.topology.num_ranks,
            "overhead_us": self.overhead_us,
            "cost": cost.to_dict(),
            "classes": [c.to_dict() for c in self.classes],
            "compute": self.compute.to_dict() if self.compute else None,
            "attention": self.attention.to_dict() if self.attention else None,
            "host": self.host.to_dict() if self.host else None,
            "cases": [c.to_dict() for c in self.cases],
            "load_avg": list(self.load_avg),
            "options": {"sizes": list(self.sizes), "round_trips": list(self.options.round_trips),
                        "repeats": self.options.repeats, "warmup": self.options.warmup,
                        "compute": self.options.compute},
            "warnings": list(self.warnings),
        }

    @property
    def sizes(self) -> tuple[int, ...]:
        return log_sizes(self.options.min_bytes, self.options.max_bytes, self.options.sizes)


def _disjoint(pairs: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    used: set[int] = set()
    out = []
    for a, b in pairs:
        if a not in used and b not in used:
            out.append((a, b))
            used.update((a, b))
    return out


def calibration_plans(topo: Topology, classes: tuple[RouteClass, ...],
                      opt: CalibrateOptions) -> list[tuple[str, Plan, dict]]:
    """Every plan a calibration runs, with a label and what it measures."""
    p = topo.num_ranks
    sizes = log_sizes(opt.min_bytes, opt.max_bytes, opt.sizes)
    out: list[tuple[str, Plan, dict]] = []
    for ci, cls in enumerate(classes):
        for n in sizes:
            for r in sorted(set(opt.round_trips)):
                meta = {"kind": "pingpong", "class": ci, "nbytes": n, "flows": 1, "round_trips": r}
                out.append((f"pingpong-c{ci}-{n}B-r{r}", pingpong_plan(topo, p, cls.pair, n, r), meta))
    if opt.compute == "attention":
        # Every rank computing at once, as step 0 of an attention plan: the kernel's speed when
        # the ranks share the cores (and the memory), which timing it alone does not show.
        per_token = kv_bytes_per_token(opt.attention_heads)
        for kv in _COMPUTE_KV_BYTES:
            tokens = max(1, kv // per_token)
            meta = {"kind": "compute", "class": 0, "nbytes": tokens * per_token, "flows": p, "round_trips": 1}
            out.append((f"compute-{tokens}", compute_plan(topo, p, opt.attention_heads, tokens), meta))
        # And small attention plans: steps, merges and messages amid the other ranks' work.
        for batch in _TREE_BATCHES:
            for shape, plan in tree_plans(topo, p, opt.attention_heads, batch, _TREE_TOKENS):
                nbytes = next(message_bytes(plan, op) for prog in plan.programs for op in prog
                              if op.kind is OpKind.SEND)
                meta = {"kind": "tree", "class": 0, "nbytes": nbytes, "flows": p, "round_trips": 1}
                out.append((f"tree-{shape}-B{batch}", plan, meta))
    if on_host_cpus(topo):
        # The library's all-reduce: gloo passes its messages in its own threads, at a CPU cost
        # per message far below the interpreter's (``coll_cpu_us``).
        for nbytes in _COLLECTIVE_BYTES:
            meta = {"kind": "collective", "class": 0, "nbytes": nbytes, "flows": p, "round_trips": 1}
            out.append((f"allreduce-{nbytes}B", allreduce_plan(topo, p, nbytes), meta))
    if not opt.contention:
        return out
    csizes = [n for n in opt.contention_sizes if opt.min_bytes <= n <= opt.max_bytes] or list(sizes[-2:])
    r = max(opt.round_trips)
    for ci, cls in enumerate(classes):
        pairs = _disjoint(cls.pairs)
        root = cls.pair[0]
        senders = [b if a == root else a for a, b in cls.pairs if root in (a, b)]
        for n in csizes:
            if n not in sizes:  # the solo reference of a concurrent case
                meta = {"kind": "pingpong", "class": ci, "nbytes": n, "flows": 1, "round_trips": r, "extra": True}
                out.append((f"pingpong-c{ci}-{n}B-r{r}", pingpong_plan(topo, p, cls.pair, n, r), meta))
            if len(pairs) > 1:
                meta = {"kind": "concurrent", "class": ci, "nbytes": n, "flows": len(pairs), "round_trips": r}
                out.append((f"concurrent-c{ci}-{n}B-x{len(pairs)}", concurrent_plan(topo, p, pairs, n, r), meta))
            if len(senders) > 1:
                for k in (1, len(senders)):
                    meta = {"kind": "fanin", "class": ci, "nbytes": n, "flows": k, "round_trips": 1}
                    out.append((f"fanin-c{ci}-{n}B-x{k}", fanin_plan(topo, p, root, senders[:k], n), meta))
    return out


def _named(meta: dict, opt: CalibrateOptions) -> str:
    """How a refusal before the run (memory) names a case: by the flag that sized it."""
    kind = {"pingpong": "ping-pong", "concurrent": "concurrent-flow", "fanin": "fan-in"}.get(meta["kind"])
    if kind is None:
        return ""  # the kernels' fixed sizes; the label says which
    return f"the {kind} case of {format_size(meta['nbytes'])} (--max-size {format_size(opt.max_bytes)})"


def _sends(m: Measurement) -> list[float]:
    return [t.done_us - t.post_us for t in m.timeline if t.op.kind is OpKind.SEND]


def calibrate(topo: Topology, options: CalibrateOptions | None = None,
              progress: Progress | None = None) -> CalibrationReport | None:
    """Measure ``topo``'s ranks and fit its parameters (see the module docstring).

    Args:
        topo: the topology whose ranks run (its rank count is the number of processes).
        options: what to measure.
        progress: ``progress(runs done, runs, what)`` as rank 0 gets on (``treeattn.exec.launch``),
            then once a stage in this process (the kernels' timing, the fits), with the runs' last count.

    Returns:
        The report (with the fitted topology) where this process is rank 0 (always for local
        runs); None on the other ranks of a torchrun/SLURM launch.

    Raises:
        InputError: fewer than two ranks, or bad options.
        ExecutionError: a rank failed, a calibration plan delivered wrong data, or the ping-pong
            times measured cannot be fitted (they do not grow with size).
    """
    opt = options or CalibrateOptions()
    if topo.num_ranks < 2:
        raise InputError(f"topology {topo.name!r} has {topo.num_ranks} rank; calibration needs at least 2")
    classes = route_classes(topo)
    planned = calibration_plans(topo, classes, opt)
    run_opts = RunOptions(repeats=opt.repeats, warmup=opt.warmup, timeout_s=opt.timeout_s,
                          setup_timeout_s=max(SETUP_TIMEOUT_S, opt.timeout_s), backend=opt.backend, check="root",
                          seed=opt.seed)
    load0 = os.getloadavg()[0]
    runs = [0, 0]

    def relay(done: int, total: int, what: str) -> None:
        runs[:] = [done, total]
        progress(done, total, what)

    def stage(what: str) -> None:
        if progress is not None:
            progress(*runs, what)

    jobs = []
    for label, plan, meta in planned:
        named = _named(meta, opt)
        jobs.append(PlanJob(label, plan, named=named, smaller="a lower --max-size" if named else ""))
    result = launch(Job(tuple(jobs), run_opts),
                    progress=None if progress is None else relay)
    if result is None:
        return None
    by_label = {m.label: m for m in result.measurements}
    wrong = [m.label for m in result.measurements if not m.correct]
    if wrong:
        raise ExecutionError(f"calibration plans delivered wrong data: {', '.join(wrong[:5])}; the transport "
                             "is broken, measurements would mean nothing")
    warnings: list[str] = []
    device = "cuda" if result.backend == "nccl" else "cpu"
    threads = rank_threads(topo.num_ranks)
    fits: list[ClassResult] = []
    small_sends: list[float] = []
    for ci, cls in enumerate(classes):
        pts = []
        for label, _, meta in planned:
            if meta["kind"] == "pingpong" and meta["class"] == ci and not meta.get("extra"):
                m = by_label[label]
                pts.append(PingPongPoint(meta["nbytes"], meta["round_trips"], m.median_us, m.spread_us))
                if ci == 0 and meta["nbytes"] <= _SMALL_BYTES:
                    small_sends.extend(_sends(m))
        try:
            fit = fit_pingpong(pts)
        except ProbeError as exc:
            # The flags were checked before the run (at least two sizes): what cannot be fitted
            # now is what the ranks measured, a failed measurement rather than bad input.
            raise ExecutionError(str(exc)) from None
        fits.append(ClassResult(cls, tuple(pts), fit))
    overhead, notes = overhead_from_sends(small_sends, min(f.fit.alpha_us for f in fits))
    warnings.extend(notes)
    compute = attention = None
    if opt.compute != "none":
        sizes = opt.compute_sizes()
        local = opt.kernels()[0]
        stage(f"timing the {local} kernel" + (" and attention" if opt.compute == "attention" else ""))
        try:
            compute = measure_compute(local, sizes, repeats=opt.repeats, threads=threads, device=device)
            if opt.compute == "attention":
                attention = measure_compute("attention", sizes, repeats=opt.repeats, threads=threads, device=device,
                                            heads=opt.attention_heads)
        except ProbeError as exc:
            warnings.append(f"{exc}; kept the topology's launch_us and mem_efficiency")
    for k, terms in ((compute, "launch_us and mem_efficiency"), (attention, "attn_launch_us and attn_gbps")):
        note = poor_fit_note(k, terms) if k is not None else None
        if note:
            warnings.append(note)
    params = FittedParams(
        classes=tuple(ClassParams(f.route_class.hops, f.fit.alpha_us, f.fit.beta_gbps) for f in fits),
        overhead_us=overhead,
        launch_us=compute.launch_us if compute else None,
        mem_eff_bw_gbps=compute.eff_bw_gbps if compute else None,
        attn_launch_us=attention.launch_us if attention else None,
        attn_gbps=attention.eff_bw_gbps if attention else None,
        source=f"{CALIBRATED_BY}: {result.backend} ping-pong on {topo.num_ranks} ranks of {topo.name!r}, "
               f"{opt.repeats} repeats" + (f", {opt.compute} kernel" if compute else ""),
    )
    fitted, notes = apply_fit(topo, params)
    host = None
    if on_host_cpus(topo) and result.backend == "gloo":
        stage("fitting the host terms through the simulator")
        measured = [(plan, by_label[label].median_us, sum(by_label[label].cpu_us))
                    for label, plan, _ in planned]
        fitted, host, notes = fit_host_terms(topo, params, measured, this_machine_cores(),
                                             start_wakeup_us=statistics.median(f.fit.skew_us for f in fits),
                                             cpu_queue="fifo" if _realtime() else "fair")
    warnings.extend(notes)
    stage("predicting the measured plans on the fitted topology")
    cases = []
    for label, plan, meta in planned:
        m = by_label[label]
        sim = simulate(plan, fitted, timeline=False)
        cases.append(CaseResult(label, meta["kind"], classes[meta["class"]].name, meta["nbytes"], meta["flows"],
                                meta["round_trips"], m.median_us, m.spread_us, sim.predicted_us,
                                sum(m.cpu_us) if m.cpu_us else None,
                                sum(sim.cpu_us) if host is not None else None))
    return CalibrationReport(fitted, topo.name, result.backend, tuple(fits), overhead, compute, attention, host,
                             tuple(cases),
                             opt, (load0, os.getloadavg()[0]), tuple(warnings))


def _realtime() -> bool:
    """Whether the ranks run under a real-time policy (inherited from this process, as
    ``treeattn validate --realtime`` starts them): the kernel then never preempts a running
    rank for another, and the simulator queues their CPU work first come, first served."""
    try:
        return os.sched_getscheduler(0) in (os.SCHED_RR, os.SCHED_FIFO)
    except (AttributeError, OSError):  # not Linux
        return False


def median_abs_rel_error(cases: list[CaseResult] | tuple[CaseResult, ...]) -> float:
    """Median over cases of |predicted - measured| / measured."""
    return statistics.median(abs(c.rel_error) for c in cases) if cases else float("nan")
