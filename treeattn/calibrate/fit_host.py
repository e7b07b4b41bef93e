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
latencies follow as ``alpha - cpu_us - launch_us``; ``flow_gbps`` is the fitted single-flow
beta. Plans run later are not part of the fit: they check it.

The cases see the sum of the per-message CPU, the per-step CPU and the merge kernel's fixed
cost far better than how it splits, so every term is searched within bounds taken from the
calibration's own measurements (``host_terms``): the merge kernel's fixed cost, which every
ping-pong message pays for its copy, at most the smallest alpha, the CPU terms at most the
fastest message case, and none below a hundredth of its whole. The merge kernel starts at no
more than half of alpha whatever it took timed alone. A term that ends at a bound is named in
``HostFit.at_bounds``, in the warnings and in a ``fit:`` entry of the fitted topology's
``sources``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from treeattn.calibrate.apply_fit import FittedParams
from treeattn.calibrate.host_terms import HostTerms
from treeattn.topology.model import Topology

__all__ = ["HostFit", "fit_host_terms", "nelder_mead"]


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
    """A merge's (and copy's) fixed cost inside a plan over the merge kernel's timed alone:
    fitted with attention plans, else held at 1 or at its bound (None when 1)."""
    start_cpu_us: float = 0.0
    """CPU time each rank spends as a run begins (fitted only with measured CPU times)."""
    cpu_us_per_kb: float = 0.0
    """CPU time per KiB at each end of a message (fitted only with measured CPU times)."""
    at_bounds: tuple[str, ...] = ()
    """Each term that sits at an end of its interval (``host_terms.Bound``), with the value,
    the bound and what the bound comes from: the cases did not place it."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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
    h = HostTerms(topo, params, cases, cores, name=name, cpu_queue=cpu_queue)
    staged, has_cpu = h.staged, h.has_cpu
    bounds = h.bounds()
    merge = 1.0
    if h.has_merge:
        # The copy that lands each message starts at no more than half a message's fixed
        # time, leaving the other half to the message ends' CPU.
        merge = min(1.0, h.alpha / 2 / params.launch_us)
    elif "merge" in bounds:
        merge = bounds["merge"].clip(1.0)
    values: dict[str, float] = {"cpu": max(h.alpha / 2, 1.0), "wake": max(start_wakeup_us, 1.0),
                                "loop": 1.5 * h.flow, "attn": 1.0, "alaunch": 1.0, "step": 0.0, "merge": merge,
                                "start": 0.0, "kb": 0.0}
    lowest = {"loop": h.flow}
    fitted_keys: set[str] = set()
    evals = 0
    if has_cpu:
        h.cpu_start(values, staged["messages"] or h.cases, ("cpu", "start", "kb"))
    # In stages, each set of terms fitted to the cases that show it, the earlier terms held:
    # fitted all at once, a noisy case lets one term stand in for another (a slow attention
    # kernel for slow messages), and the plans predicted later inherit the mix-up.
    measured_cpu = ["start", "kb"] if has_cpu else []
    stages = (("messages", ["cpu", "wake"] + (["loop"] if h.has_loop else []) + measured_cpu),
              ("compute", (["attn"] if h.has_attn else []) + (["alaunch"] if h.has_launch else [])),
              ("plan", [k for k, on in (("step", h.has_step), ("merge", h.has_merge), ("coll", h.has_coll)) if on]))
    for stage, keys in stages:
        group = staged[stage] or (h.cases if stage == "messages" else [])
        if stage == "plan" and keys:
            # A plan's messages pay cpu_us too: refit it and the wake-up with the plans' terms,
            # to the message cases and the plans together (the attention kernel stays held).
            keys, group = ["cpu", "wake", *keys], staged["messages"] + group
            if has_cpu and "step" in keys:
                # Timing alone hardly tells a step's CPU from its messages' (a search that
                # starts at a free step stays there, every message end paying for both);
                # the CPU the ranks used does: plans send one message a step, or several.
                h.cpu_start(values, group, ("cpu", "step"))
        if not keys or not group:
            continue
        if "coll" in keys:
            values["coll"] = values["cpu"]

        def loss(x: Sequence[float], keys: list[str] = keys, group: list = group) -> float:
            return h.rms(h.build({**values, **dict(zip(keys, x, strict=True))})[0], group) ** 2

        start = [bounds[k].clip(max(values[k], 1.0) if k in ("step", "start", "kb") else values[k]) for k in keys]
        best, _, n = nelder_mead(loss, start, lower=[lowest.get(k, 0.0) for k in keys],
                                 iterations=max(200, 60 * len(keys)),
                                 bounds=[(bounds[k].lo, bounds[k].hi) for k in keys])
        values.update(zip(keys, best, strict=True))
        fitted_keys.update(keys)
        evals += n
    fitted, notes = h.build(values)
    held = {"merge"} & set(bounds)  # applied, fitted or not
    at = tuple(bounds[k].describe(values[k]) for k in bounds
               if k in fitted_keys | held and bounds[k].side(values[k]))
    # One line per term, in the warnings and in the fitted topology's sources (its YAML).
    flags = [f"fit: {a}: the cases did not place it inside its bounds" for a in at]
    notes = [*notes, *flags]
    fitted = dataclasses.replace(fitted, sources=(*fitted.sources, *flags))

    def got(key: str) -> float | None:
        return values[key] if key in fitted_keys or (key in held and values[key] != 1.0) else None

    fit = HostFit(cores=cores, cpu_us=values["cpu"], wakeup_us=values["wake"], loopback_gbps=got("loop"),
                  rms_log_error=h.rms(fitted, h.cases), cases=len(h.cases), evaluations=evals,
                  attn_factor=got("attn"), step_us=values["step"], cpu_queue=cpu_queue, merge_factor=got("merge"),
                  attn_launch_factor=got("alaunch"), coll_cpu_us=got("coll"), start_cpu_us=values["start"],
                  cpu_us_per_kb=values["kb"], at_bounds=at)
    return fitted, fit, notes


def nelder_mead(f: Callable[[Sequence[float]], float], start: Sequence[float], lower: Sequence[float],
                iterations: int = 200, tol: float = 1e-4,
                bounds: Sequence[tuple[float, float]] | None = None) -> tuple[list[float], float, int]:
    """Minimise ``f`` over x >= ``lower`` by Nelder-Mead on y = log(x - lower + 1e-9 * scale),
    each x clipped into its (lo, hi) of ``bounds`` where given: ``f`` is flat beyond a bound,
    so a minimum that lies beyond ends at the bound, and a search that stays inside them runs
    as it would without them.

    Deterministic (same start, same answer). Returns (x, f(x), evaluations)."""
    scale = [max(abs(s), 1e-9) for s in start]
    n = len(start)
    box = list(bounds) if bounds is not None else [(-math.inf, math.inf)] * n

    def to_x(y: Sequence[float]) -> list[float]:
        return [min(max(lo + math.exp(v), b[0]), b[1]) for v, lo, b in zip(y, lower, box, strict=True)]

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
