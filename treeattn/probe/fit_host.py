"""Fit the simulator's host CPU terms to the calibration cases (pure: no torch).

Ranks that are processes on one machine's CPUs do not behave like GPUs behind a NIC: a
message costs CPU time at both ends, ranks that outnumber the cores slow each other down,
every timed step starts with blocked processes waking up, and TCP over loopback gives one
connection one core's copy rate while several connections use more cores. The simulator
models these with ``cost.host_cores``, ``cost.cpu_us``, ``cost.wakeup_us`` and a loopback
link's ``flow_gbps`` (see ``treeattn.cost.simulate``). Ping-pong alone cannot separate them
(a lone message's time is its latency plus the receiver's CPU work, whatever the split), but
the concurrent-flow and fan-in cases calibration runs beside it can. So this module takes
the per-class alpha/beta fit, and searches (Nelder-Mead, on the logarithms) for the
``cpu_us``, ``wakeup_us`` and loopback aggregate bandwidth that make the simulator's
predictions of *every calibration case* closest to the measured times (least squares of
log(predicted / measured)). Link latencies follow as ``alpha - cpu_us``; ``flow_gbps`` is the
fitted single-flow beta. Plans run later are not part of the fit: they check it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from treeattn.cost.simulate import simulate
from treeattn.plan.ir import OpKind, Plan
from treeattn.probe.apply_fit import FittedParams, apply_fit
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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def on_host_cpus(topo: Topology) -> bool:
    """Every rank is a process on a ``host`` device (CPU ranks, gloo)."""
    return all(topo.rank_device(r).kind is DeviceKind.HOST for r in range(topo.num_ranks))


def fit_host_terms(topo: Topology, params: FittedParams, cases: Sequence[tuple[Plan, float]], cores: int,
                   start_wakeup_us: float = 0.0, name: str | None = None) -> tuple[Topology, HostFit, list[str]]:
    """Fit ``cpu_us``, ``wakeup_us`` and the loopback aggregate to ``cases``.

    Args:
        topo: the topology before fitting (as passed to ``apply_fit``).
        params: the per-class alpha/beta fit (its ``overhead_us`` is replaced: on host CPUs a
            message's fixed cost is the receiver's ``cpu_us`` plus the route latency).
        cases: (plan, measured median in µs) of every calibration case.
        cores: CPU cores the ranks share (this machine's).
        start_wakeup_us: starting point of the wake-up (the ping-pong fit's per-iteration term).
        name: name of the fitted topology.

    Returns:
        The fitted topology, the fit, and warnings (from ``apply_fit``).
    """
    alpha = min(c.alpha_us for c in params.classes)
    has_loop = any(ln.kind is LinkKind.LOOPBACK for ln in topo.links)
    # With cases where every rank computes at once, the attention kernel's bandwidth is fitted
    # too (as a factor on the one timed alone): the ranks share the cores and the memory.
    has_attn = params.attn_gbps is not None and any(
        op.kind is OpKind.COMPUTE for plan, _ in cases for prog in plan.programs for op in prog)

    def build(x: Sequence[float]) -> tuple[Topology, list[str]]:
        cpu, wake = x[0], x[1]
        fit = dataclasses.replace(params, overhead_us=min(cpu, alpha))
        if has_attn:
            fit = dataclasses.replace(fit, attn_gbps=params.attn_gbps * x[-1])
        fitted, notes = apply_fit(topo, fit, name=name)
        links = fitted.links
        if has_loop:
            links = tuple(dataclasses.replace(ln, flow_gbps=ln.bw_gbps, bw_gbps=max(ln.bw_gbps, x[2]))
                          if ln.kind is LinkKind.LOOPBACK else ln for ln in links)
        cost = dataclasses.replace(fitted.cost, host_cores=cores, cpu_us=cpu, cpu_scope="machine", wakeup_us=wake)
        return dataclasses.replace(fitted, links=links, cost=cost), notes

    def loss(x: Sequence[float]) -> float:
        t, _ = build(x)
        total = 0.0
        for plan, measured in cases:
            total += math.log(simulate(plan, t, timeline=False).predicted_us / measured) ** 2
        return total / len(cases)

    flow = max((ln.bw_gbps for ln in apply_fit(topo, params, name=name)[0].links if ln.kind is LinkKind.LOOPBACK),
               default=1.0)
    start = [max(alpha / 2, 1.0), max(start_wakeup_us, 1.0)] + ([1.5 * flow] if has_loop else []) + (
        [1.0] if has_attn else [])
    lo = [0.0, 0.0] + ([flow] if has_loop else []) + ([0.0] if has_attn else [])
    best, value, evals = nelder_mead(loss, start, lower=lo)
    fitted, notes = build(best)
    fit = HostFit(cores=cores, cpu_us=best[0], wakeup_us=best[1], loopback_gbps=best[2] if has_loop else None,
                  rms_log_error=math.sqrt(value), cases=len(cases), evaluations=evals,
                  attn_factor=best[-1] if has_attn else None)
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
