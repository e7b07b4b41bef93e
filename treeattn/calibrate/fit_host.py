"""Fit the simulator's host CPU terms to the calibration cases (pure: no torch).

Ranks that are processes on one machine's CPUs do not behave like GPUs behind a NIC: a
message costs CPU time at both ends, ranks that outnumber the cores slow each other down,
every timed step starts with blocked processes waking up, and TCP over loopback gives one
connection one core's copy rate while several connections use more cores. The simulator
models these with ``cost.host`` (``HostParams``: ``host_cores``, ``cpu_us``, ``step_us``, ``wakeup_us``
and a loopback link's ``flow_gbps`` (see ``treeattn.cost.simulate``). Ping-pong alone cannot
separate them (a lone message's time is its latency plus the receiver's CPU work, whatever
the split), but the concurrent-flow and fan-in cases calibration runs beside it can. So this
module takes the per-class alpha/beta fit and searches (Nelder-Mead, on the logarithms), in
stages, each with the earlier terms held:

1. ``cpu_us``, ``wakeup_us``, the loopback aggregate bandwidth and, where the ranks' CPU
   time was measured, ``start_cpu_us`` and ``cpu_us_per_kb``, to the message cases
   (ping-pong, concurrent flows, fan-in);
2. factors on the attention kernel's bandwidth and fixed cost, to the cases where every rank
   computes at once (the fixed cost so fitted is a run's first kernel; a rank's later ones
   keep the kernel's own, timed alone: ``attn_next_launch_us``);
3. ``step_us``, a factor on the merge kernel's fixed cost and ``coll_cpu_us``, with
   ``cpu_us`` and ``wakeup_us`` refitted, to the small attention plans and library
   all-reduces (what a rank pays amid the others' work) and the message cases together,
   starting, where the ranks' CPU time was measured, from the ``cpu_us`` and ``step_us``
   that it puts them at.

Each stage minimises the least squares of log(predicted / measured) over its cases, of
their times and, where measured, of the CPU time the ranks used (the simulator's CPU work
summed over ranks): timing alone cannot tell a message's CPU work from its latency. Link
latencies follow as ``alpha - cpu_us``; ``flow_gbps`` is the fitted single-flow beta. Plans
run later are not part of the fit: they check it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from treeattn.calibrate.apply_fit import FittedParams, apply_fit
from treeattn.cost.simulate import simulate
from treeattn.plan.ir import OpKind, Plan
from treeattn.topology.model import DeviceKind, LinkKind, Topology

__all__ = ["HostFit", "fit_host_terms", "on_host_cpus", "nelder_mead"]


@dataclass(frozen=True, slots=True)
class HostFit:
    """The fitted host CPU terms and how well they explain the calibration cases."""

    cores: int
    cpu_us: float
    wakeup_us: float
    loopback_gbps: float | None
    """Aggregate loopback bandwidth (all flows together); None without a loopback link."""
    rms_log_error: float
    """Root mean square of log(predicted / measured) over the cases at the optimum."""
    cases: int
    evaluations: int
    attn_factor: float | None = None
    """The attention kernel's bandwidth with every rank computing, over its bandwidth alone."""
    step_us: float = 0.0
    """CPU time per step of transfers (fitted only with tree cases)."""
    coll_cpu_us: float | None = None
    """CPU time per message end inside the library's collectives (with collective cases)."""
    attn_launch_factor: float | None = None
    """The attention kernel's fixed cost with every rank at work, over its cost alone."""
    cpu_queue: str = "fair"
    """How the ranks shared the cores (``fifo`` under a real-time policy)."""
    merge_factor: float | None = None
    """A merge's (and copy's) fixed cost inside a plan over the merge kernel's timed alone."""
    start_cpu_us: float = 0.0
    """CPU time each rank spends as a run begins (fitted only with measured CPU times)."""
    cpu_us_per_kb: float = 0.0
    """CPU time per KiB at each end of a message (fitted only with measured CPU times)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def on_host_cpus(topo: Topology) -> bool:
    """Every rank is a process on a ``host`` device (CPU ranks, gloo)."""
    return all(topo.rank_device(r).kind is DeviceKind.HOST for r in range(topo.num_ranks))


def fit_host_terms(topo: Topology, params: FittedParams, cases: Sequence[tuple], cores: int,
                   start_wakeup_us: float = 0.0, name: str | None = None,
                   cpu_queue: str = "fair") -> tuple[Topology, HostFit, list[str]]:
    """Fit the host terms to ``cases``, in stages (see the module docstring).

    Args:
        topo: the topology before fitting (as passed to ``apply_fit``).
        params: the per-class alpha/beta fit (its ``overhead_us`` is replaced: on host CPUs a
            message's fixed cost is the receiver's ``cpu_us`` plus the route latency).
        cases: (plan, measured median in µs[, CPU µs the ranks used in one iteration, summed])
            of every calibration case.
        cores: CPU cores the ranks share (this machine's).
        start_wakeup_us: starting point of the wake-up (the ping-pong fit's per-iteration term).
        name: name of the fitted topology.
        cpu_queue: how the ranks share the cores (``fair``, or ``fifo`` for ranks under a
            real-time policy); the cases were measured so, and plans will be.

    Returns:
        The fitted topology, the fit, and warnings (from ``apply_fit``).
    """
    alpha = min(c.alpha_us for c in params.classes)
    has_loop = any(ln.kind is LinkKind.LOOPBACK for ln in topo.links)

    def kind(plan: Plan) -> str:
        ops = [op.kind for prog in plan.programs for op in prog]
        if ops and all(k is OpKind.COMPUTE for k in ops):
            return "compute"
        if OpKind.COLLECTIVE in ops or (not plan.is_raw and OpKind.COMPUTE in ops):
            return "plan"
        return "messages"

    # Each case: (plan, measured time, measured CPU summed over ranks or None).
    cases = [(c[0], c[1], c[2] if len(c) > 2 and c[2] else None) for c in cases]
    has_cpu = any(c[2] is not None for c in cases) and on_host_cpus(topo)
    staged: dict[str, list[tuple[Plan, float, float | None]]] = {"messages": [], "compute": [], "plan": []}
    for case in cases:
        staged[kind(case[0])].append(case)
    plans = staged["plan"]
    # Cases where every rank computes at once fit the attention kernel as the ranks run it
    # (factors on its bandwidth and, with two sizes or more, its fixed cost, timed alone).
    has_attn = params.attn_gbps is not None and bool(staged["compute"])
    sizes = {(c[0].workload.batch, c[0].workload.split) for c in staged["compute"]}
    has_launch = has_attn and params.attn_launch_us is not None and params.attn_launch_us > 0 and len(sizes) > 1
    # Small attention plans separate a step's cost from a message's and show a merge amid the
    # other ranks' work; the library's collectives pass messages in their own threads.
    has_step = any(not c[0].is_raw for c in plans)
    has_merge = has_step and params.launch_us is not None and params.launch_us > 0
    has_coll = on_host_cpus(topo) and any(op.kind is OpKind.COLLECTIVE for c in plans
                                          for prog in c[0].programs for op in prog)
    flow = max((ln.bw_gbps for ln in apply_fit(topo, params, name=name)[0].links if ln.kind is LinkKind.LOOPBACK),
               default=1.0)
    values: dict[str, float] = {"cpu": max(alpha / 2, 1.0), "wake": max(start_wakeup_us, 1.0), "loop": 1.5 * flow,
                                "attn": 1.0, "alaunch": 1.0, "step": 0.0, "merge": 1.0, "start": 0.0, "kb": 0.0}
    lowest = {"loop": flow}
    fitted_keys: set[str] = set()

    def build(v: dict[str, float]) -> tuple[Topology, list[str]]:
        fit = dataclasses.replace(params, overhead_us=min(v["cpu"], alpha))
        if has_attn:
            fit = dataclasses.replace(fit, attn_gbps=params.attn_gbps * v["attn"])
        if has_launch:
            fit = dataclasses.replace(fit, attn_launch_us=params.attn_launch_us * v["alaunch"])
        if has_merge:
            fit = dataclasses.replace(fit, launch_us=params.launch_us * v["merge"])
        fitted, notes = apply_fit(topo, fit, name=name)
        links = fitted.links
        if has_loop:
            links = tuple(dataclasses.replace(ln, flow_gbps=ln.bw_gbps, bw_gbps=max(ln.bw_gbps, v["loop"]))
                          if ln.kind is LinkKind.LOOPBACK else ln for ln in links)
        # The fitted launch is a run's first kernel amid every rank's; a rank's later ones
        # (ring attention) run warm, as timed alone.
        cost = dataclasses.replace(fitted.cost, attn_next_launch_us=params.attn_launch_us if has_launch else None)
        cost = cost.with_host(host_cores=cores, cpu_us=v["cpu"], cpu_scope="machine", wakeup_us=v["wake"],
                              step_us=v["step"], cpu_queue=cpu_queue, coll_cpu_us=v.get("coll"),
                              start_cpu_us=v["start"], cpu_us_per_kb=v["kb"])
        return dataclasses.replace(fitted, links=links, cost=cost), notes

    def rms(t: Topology, group: Sequence[tuple[Plan, float, float | None]]) -> float:
        total, n = 0.0, 0
        for plan, measured, cpu in group:
            res = simulate(plan, t, timeline=False)
            total += math.log(res.predicted_us / measured) ** 2
            n += 1
            if cpu is not None and has_cpu:
                # The CPU the ranks used pins the CPU terms where timing alone cannot tell
                # them from latency.
                total += math.log(max(sum(res.cpu_us), 1e-3) / cpu) ** 2
                n += 1
        return math.sqrt(total / n)

    def cpu_start(group: Sequence[tuple[Plan, float, float | None]], keys: Sequence[str]) -> None:
        """Start the CPU terms ``keys`` where the measured CPU times put them: the CPU the
        model charges is linear in them (up to the receive batching), so least squares on the
        relative residuals, terms that come out negative dropped."""
        keys = list(keys)
        rows = [(plan, cpu) for plan, _, cpu in group if cpu]
        if len(rows) < len(keys):
            return
        zero = {**values, **dict.fromkeys(keys, 0.0)}

        def charged(v: dict[str, float]) -> np.ndarray:
            t = build(v)[0]
            return np.array([sum(simulate(plan, t, timeline=False).cpu_us) for plan, _ in rows])

        meas = np.array([cpu for _, cpu in rows])
        base = charged(zero)
        cols = np.stack([charged({**zero, k: 1.0}) - base for k in keys], axis=1) / meas[:, None]
        target = (meas - base) / meas
        live = list(range(len(keys)))
        x = np.zeros(len(keys))
        while live:
            sol = np.linalg.lstsq(cols[:, live], target, rcond=None)[0]
            if (sol >= 0).all():
                x[live] = sol
                break
            live = [i for i, v in zip(live, sol, strict=True) if v > 0]
        values.update({k: float(v) for k, v in zip(keys, x, strict=True) if v > 0})

    evals = 0
    if has_cpu:
        cpu_start(staged["messages"] or cases, ("cpu", "start", "kb"))
    # In stages, each set of terms fitted to the cases that show it, the earlier terms held:
    # fitted all at once, a noisy case lets one term stand in for another (a slow attention
    # kernel for slow messages), and the plans predicted later inherit the mix-up.
    measured_cpu = ["start", "kb"] if has_cpu else []
    stages = (("messages", ["cpu", "wake"] + (["loop"] if has_loop else []) + measured_cpu),
              ("compute", (["attn"] if has_attn else []) + (["alaunch"] if has_launch else [])),
              ("plan", [k for k, on in (("step", has_step), ("merge", has_merge), ("coll", has_coll)) if on]))
    for stage, keys in stages:
        group = staged[stage] or (cases if stage == "messages" else [])
        if stage == "plan" and keys:
            # A plan's messages pay cpu_us too: refit it and the wake-up with the plans' terms,
            # to the message cases and the plans together (the attention kernel stays held).
            keys, group = ["cpu", "wake", *keys], staged["messages"] + group
            if has_cpu and "step" in keys:
                # Timing alone hardly tells a step's CPU from its messages' (a search that
                # starts at a free step stays there, every message end paying for both);
                # the CPU the ranks used does: plans send one message a step, or several.
                cpu_start(group, ("cpu", "step"))
        if not keys or not group:
            continue
        if "coll" in keys:
            values["coll"] = values["cpu"]

        def loss(x: Sequence[float], keys: list[str] = keys, group: list = group) -> float:
            return rms(build({**values, **dict(zip(keys, x, strict=True))})[0], group) ** 2

        best, _, n = nelder_mead(loss, [max(values[k], 1.0) if k in ("step", "start", "kb") else values[k]
                                        for k in keys],
                                 lower=[lowest.get(k, 0.0) for k in keys], iterations=max(200, 60 * len(keys)))
        values.update(zip(keys, best, strict=True))
        fitted_keys.update(keys)
        evals += n
    fitted, notes = build(values)

    def got(key: str) -> float | None:
        return values[key] if key in fitted_keys else None

    fit = HostFit(cores=cores, cpu_us=values["cpu"], wakeup_us=values["wake"], loopback_gbps=got("loop"),
                  rms_log_error=rms(fitted, cases), cases=len(cases), evaluations=evals, attn_factor=got("attn"),
                  step_us=values["step"], cpu_queue=cpu_queue, merge_factor=got("merge"),
                  attn_launch_factor=got("alaunch"), coll_cpu_us=got("coll"), start_cpu_us=values["start"],
                  cpu_us_per_kb=values["kb"])
    return fitted, fit, notes


def nelder_mead(f: Callable[[Sequence[float]], float], start: Sequence[float], lower: Sequence[float],
                iterations: int = 200, tol: float = 1e-4) -> tuple[list[float], float, int]:
    """Minimise ``f`` over x >= ``lower`` by Nelder-Mead on y = log(x - lower + 1e-9 * scale).

    Deterministic (same start, same answer). Returns (x, f(x), evaluations)."""
    scale = [max(abs(s), 1e-9) for s in start]
    n = len(start)

    def to_x(y: Sequence[float]) -> list[float]:
        return [lo + math.exp(v) for v, lo in zip(y, lower, strict=True)]

    evals = 0

    def g(y: Sequence[float]) -> float:
        nonlocal evals
        evals += 1
        return f(to_x(y))

    y0 = [math.log(max(s - lo, 1e-3 * sc)) for s, lo, sc in zip(start, lower, scale, strict=True)]
    simplex = [y0] + [[v + (0.5 if i == j else 0.0) for j, v in enumerate(y0)] for i in range(n)]
    values = [g(y) for y in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] <= tol * max(abs(values[0]), 1e-12):
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        refl = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        fr = g(refl)
        if fr < values[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            fe = g(exp)
            simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            fc = g(con)
            if fc < values[-1]:
                simplex[-1], values[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (v - b) for b, v in zip(best, p, strict=True)] for p in simplex[1:]]
                values = [values[0]] + [g(y) for y in simplex[1:]]
    i = min(range(n + 1), key=values.__getitem__)
    return to_x(simplex[i]), values[i], evals
