"""The host CPU terms of one calibration as a function of their values (pure: no torch).

``HostTerms`` builds the fitted topology from a set of term values and scores it against the
measured cases through the simulator; ``bounds`` gives each term the interval a fit may put
it in. ``fit_host`` searches the values.

Every bound comes from a figure the same calibration measured. A term is a part of some
measured whole, so it is at most that whole, and at least one hundredth of it: below that it
changes no prediction by more than about 1 %, and a fit that drives it there has in effect
dropped the term, which is worth saying (``Bound.side``). The wholes:

* the smallest ping-pong alpha ``A`` (one message's fixed time, as ``pingpong`` fits it):
  every ping-pong message lands by a copy, so the merge kernel's fixed cost (``launch_us``:
  the kernel timed alone times the ``merge`` factor) is at most ``A``; ``A / 100`` is the
  floor of the per-message and per-step CPU (``cpu_us``, ``coll_cpu_us``, ``step_us``);
* the fastest message case ``T`` (its measured median) holds a run's start
  (``start_cpu_us``), one wake-up (``wakeup_us``) and at least one message and one step, so
  bounds each of them and the CPU terms above (a message end's CPU can exceed ``A``: ``A``
  as ``apply_fit`` reads it is the receiver's CPU, the route and the copy, not the step);
* the fastest compute case holds the attention kernel's first launch (``alaunch``);
* the loopback aggregate is at least one flow's rate (beta) and at most one per core.

The attention kernel's bandwidth factor keeps within ten times either way of the kernel timed
alone; ``cpu_us_per_kb`` is only kept from going negative (the ranks' measured CPU time fixes
it, and timing cannot trade it against the other terms).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from treeattn.calibrate.apply_fit import FittedParams, apply_fit
from treeattn.cost.simulate import simulate
from treeattn.plan.ir import OpKind, Plan
from treeattn.topology.model import DeviceKind, LinkKind, Topology

__all__ = ["Case", "HostTerms", "Bound", "on_host_cpus"]

FLOOR = 100.0
"""A term's lower bound is its whole over this."""
AT_BOUND = 0.01
"""A fitted value within this fraction of an end sits at that bound."""


@dataclass(frozen=True, slots=True)
class Bound:
    """Where a fit may put one term, and what the ends come from."""

    lo: float
    hi: float
    term: str
    """The topology's term it sets (``cpu_us``, ``launch_us``, ...)."""
    whole: str
    """The measured figure the ends derive from."""
    scale: float = 1.0
    """The term's value per unit of the fitted value (a factor's reference figure)."""

    def clip(self, x: float) -> float:
        return min(max(x, self.lo), self.hi)

    def side(self, x: float) -> str | None:
        """``lower`` or ``upper`` where ``x`` sits at that end, else None."""
        if x <= self.lo * (1 + AT_BOUND):
            return "lower"
        if x >= self.hi * (1 - AT_BOUND):
            return "upper"
        return None

    def describe(self, x: float) -> str:
        """One phrase: the term, its value and the bound it sits at."""
        side = self.side(x)
        end = self.lo if side == "lower" else self.hi
        return f"{self.term} {x * self.scale:.4g} at its {side} bound {end * self.scale:.4g} ({self.whole})"


def on_host_cpus(topo: Topology) -> bool:
    """Every rank is a process on a ``host`` device (CPU ranks, gloo)."""
    return all(topo.rank_device(r).kind is DeviceKind.HOST for r in range(topo.num_ranks))


def _kind(plan: Plan) -> str:
    """Which stage's cases a plan belongs to: ``messages``, ``compute`` or ``plan``."""
    ops = [op.kind for prog in plan.programs for op in prog]
    if ops and all(k is OpKind.COMPUTE for k in ops):
        return "compute"
    if OpKind.COLLECTIVE in ops or (not plan.is_raw and OpKind.COMPUTE in ops):
        return "plan"
    return "messages"


Case = tuple[Plan, float, "float | None"]
"""(plan, measured median in µs, CPU µs the ranks used in one iteration summed, or None)."""


class HostTerms:
    """The host terms of one calibration as a function of their values: the topology they
    make and how far its predictions are from the measured cases.

    Values are keyed ``cpu`` (``cpu_us``), ``wake`` (``wakeup_us``), ``loop`` (the loopback
    aggregate), ``start`` (``start_cpu_us``), ``kb`` (``cpu_us_per_kb``), ``step`` (``step_us``),
    ``coll`` (``coll_cpu_us``), and factors on what the kernels cost timed alone: ``attn`` (the
    attention kernel's bandwidth), ``alaunch`` (its fixed cost), ``merge`` (the merge kernel's
    fixed cost, which every merge and copy pays).
    """

    def __init__(self, topo: Topology, params: FittedParams, cases: Sequence[tuple], cores: int,
                 name: str | None = None, cpu_queue: str = "fair") -> None:
        self.topo, self.params, self.cores, self.name, self.cpu_queue = topo, params, cores, name, cpu_queue
        self.alpha = min(c.alpha_us for c in params.classes)
        self.has_loop = any(ln.kind is LinkKind.LOOPBACK for ln in topo.links)
        self.cases: list[Case] = [(c[0], c[1], c[2] if len(c) > 2 and c[2] else None) for c in cases]
        self.has_cpu = any(c[2] is not None for c in self.cases) and on_host_cpus(topo)
        self.staged: dict[str, list[Case]] = {"messages": [], "compute": [], "plan": []}
        for case in self.cases:
            self.staged[_kind(case[0])].append(case)
        plans = self.staged["plan"]
        # Cases where every rank computes at once fit the attention kernel as the ranks run it
        # (factors on its bandwidth and, with two sizes or more, its fixed cost, timed alone).
        self.has_attn = params.attn_gbps is not None and bool(self.staged["compute"])
        sizes = {(c[0].workload.batch, c[0].workload.split) for c in self.staged["compute"]}
        self.has_launch = (self.has_attn and params.attn_launch_us is not None and params.attn_launch_us > 0
                           and len(sizes) > 1)
        # Small attention plans separate a step's cost from a message's and show a merge amid the
        # other ranks' work; the library's collectives pass messages in their own threads.
        self.has_step = any(not c[0].is_raw for c in plans)
        self.has_merge = self.has_step and params.launch_us is not None and params.launch_us > 0
        self.has_coll = on_host_cpus(topo) and any(op.kind is OpKind.COLLECTIVE for c in plans
                                                   for prog in c[0].programs for op in prog)
        self.flow = max((ln.bw_gbps for ln in apply_fit(topo, params, name=name)[0].links
                         if ln.kind is LinkKind.LOOPBACK), default=1.0)

    def build(self, v: dict[str, float]) -> tuple[Topology, list[str]]:
        """The fitted topology with the terms ``v``, and ``apply_fit``'s warnings."""
        params, has_launch = self.params, self.has_launch
        fit = dataclasses.replace(params, overhead_us=min(v["cpu"], self.alpha))
        if self.has_attn:
            fit = dataclasses.replace(fit, attn_gbps=params.attn_gbps * v["attn"])
        if has_launch:
            fit = dataclasses.replace(fit, attn_launch_us=params.attn_launch_us * v["alaunch"])
        if params.launch_us:
            # Fitted with plan cases; otherwise held at 1, or at its bound where the kernel
            # timed alone took longer than a whole message.
            fit = dataclasses.replace(fit, launch_us=params.launch_us * v["merge"])
        fitted, notes = apply_fit(self.topo, fit, name=self.name)
        links = fitted.links
        if self.has_loop:
            links = tuple(dataclasses.replace(ln, flow_gbps=ln.bw_gbps, bw_gbps=max(ln.bw_gbps, v["loop"]))
                          if ln.kind is LinkKind.LOOPBACK else ln for ln in links)
        # The fitted launch is a run's first kernel amid every rank's; a rank's later ones
        # (ring attention) run warm, as timed alone.
        cost = dataclasses.replace(fitted.cost, attn_next_launch_us=params.attn_launch_us if has_launch else None)
        cost = cost.with_host(host_cores=self.cores, cpu_us=v["cpu"], cpu_scope="machine", wakeup_us=v["wake"],
                              step_us=v["step"], cpu_queue=self.cpu_queue, coll_cpu_us=v.get("coll"),
                              start_cpu_us=v["start"], cpu_us_per_kb=v["kb"])
        return dataclasses.replace(fitted, links=links, cost=cost), notes

    def residuals(self, t: Topology, group: Sequence[Case]) -> list[float]:
        """log(predicted / measured) of each case's time and, where measured, of the CPU time
        the ranks used (the simulator's CPU work summed over ranks)."""
        out = []
        for plan, measured, cpu in group:
            res = simulate(plan, t, timeline=False)
            out.append(math.log(res.predicted_us / measured))
            if cpu is not None and self.has_cpu:
                # The CPU the ranks used pins the CPU terms where timing alone cannot tell
                # them from latency.
                out.append(math.log(max(sum(res.cpu_us), 1e-3) / cpu))
        return out

    def rms(self, t: Topology, group: Sequence[Case]) -> float:
        r = self.residuals(t, group)
        return math.sqrt(sum(x * x for x in r) / len(r))

    def cpu_start(self, values: dict[str, float], group: Sequence[Case], keys: Sequence[str]) -> None:
        """Start the CPU terms ``keys`` where the measured CPU times put them: the CPU the
        model charges is linear in them (up to the receive batching), so least squares on the
        relative residuals, terms that come out negative dropped."""
        keys = list(keys)
        rows = [(plan, cpu) for plan, _, cpu in group if cpu]
        if len(rows) < len(keys):
            return
        zero = {**values, **dict.fromkeys(keys, 0.0)}

        def charged(v: dict[str, float]) -> np.ndarray:
            t = self.build(v)[0]
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

    def bounds(self) -> dict[str, Bound]:
        """Each term's interval (see the module docstring), keyed as the values are."""
        a = self.alpha
        message = [m for _, m, _ in self.staged["messages"]] or [m for _, m, _ in self.cases]
        t = min(message)
        per_message = f"alpha {a:.4g} µs / 100 .. the fastest message case, {t:.4g} µs"
        out = {
            "cpu": Bound(a / FLOOR, t, "cpu_us", per_message),
            "coll": Bound(a / FLOOR, t, "coll_cpu_us", per_message),
            "step": Bound(a / FLOOR, t, "step_us", per_message),
            "wake": Bound(t / FLOOR, t, "wakeup_us", f"the fastest message case, {t:.4g} µs, / 100 .. x 1"),
            "start": Bound(t / FLOOR, t, "start_cpu_us", f"the fastest message case, {t:.4g} µs, / 100 .. x 1"),
            "kb": Bound(0.0, math.inf, "cpu_us_per_kb", "CPU time is not negative"),
            "loop": Bound(self.flow, self.cores * self.flow, "loopback aggregate GB/s",
                          f"one flow's {self.flow:.4g} GB/s .. one per core"),
        }
        p = self.params
        if p.launch_us:
            ref = min(p.launch_us, a)
            out["merge"] = Bound(ref / FLOOR / p.launch_us, a / p.launch_us, "launch_us",
                                 f"{ref:.4g} µs / 100 .. the smallest ping-pong alpha, {a:.4g} µs", scale=p.launch_us)
        if p.attn_gbps:
            out["attn"] = Bound(0.1, 10.0, "attn_gbps", f"ten times either way of {p.attn_gbps:.4g} GB/s timed alone",
                                scale=p.attn_gbps)
        if p.attn_launch_us:
            tc = min((m for _, m, _ in self.staged["compute"]), default=math.inf)
            ref = min(p.attn_launch_us, tc)
            out["alaunch"] = Bound(ref / FLOOR / p.attn_launch_us, tc / p.attn_launch_us, "attn_launch_us",
                                   f"{ref:.4g} µs / 100 .. the fastest compute case, {tc:.4g} µs",
                                   scale=p.attn_launch_us)
        return out
