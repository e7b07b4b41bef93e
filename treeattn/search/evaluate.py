"""Scoring schedules: build the plan, time it with the simulator, remember the answer.

Every time the search compares comes from ``treeattn.cost.simulate`` on the plan the
builders make, so a candidate's ``predicted_us`` is exactly what ``treeattn sim`` would say
about its plan file. The cache key is the builder call (algorithm, its arguments, chunks).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from treeattn.cost.compute import ComputeModel
from treeattn.cost.simulate import simulate
from treeattn.errors import InfeasiblePlanError
from treeattn.plan.builders import build
from treeattn.plan.ir import OpKind, Plan, TopologyRef, message_bytes
from treeattn.topology.model import Topology
from treeattn.workload import Payload

__all__ = ["Schedule", "Evaluator", "chunk_choices", "sweep_chunks"]


@dataclass(frozen=True)
class Schedule:
    """One point of the search space without its chunk count: a builder call plus a label.

    ``family`` names the candidate family (``binomial``, ``hierarchical``, ``multirail``...),
    ``describe`` its parameters in short human form (what tables and JSON show), and
    ``kwargs`` the exact keyword arguments of ``treeattn.plan.build``.
    """

    family: str
    algorithm: str
    kwargs: dict[str, Any]
    describe: dict[str, Any] = field(default_factory=dict)
    rows_per_chunk: int = 1
    """Plan chunks per requested chunk (ring: p segments; multirail: T trees)."""

    @property
    def key(self) -> str:
        return self.algorithm + json.dumps(self.kwargs, sort_keys=True, separators=(",", ":"))


def chunk_choices(payload: Payload, ranks: int, limit: int | None = None) -> tuple[int, ...]:
    """Chunk counts to try: powers of two up to the payload's rows (and ``limit``).

    Args:
        payload: the workload; its ``rows`` caps the chunk count.
        ranks: p; large rank counts get a lower cap, as every chunk multiplies the ops.
        limit: an explicit cap.

    Returns:
        ``(1, 2, 4, ...)``.
    """
    cap = 64 if ranks <= 64 else 32 if ranks <= 256 else 16
    if limit is not None:
        cap = min(cap, limit)
    cap = max(1, min(cap, payload.rows))
    out, c = [], 1
    while c <= cap:
        out.append(c)
        c *= 2
    return tuple(out)


class Evaluator:
    """Builds and simulates plans for one topology and payload, with a cache and a counter.

    Args:
        topo: where plans are timed.
        payload: what they reduce.
        on_eval: called after each new simulation with the number done so far (progress).
    """

    def __init__(self, topo: Topology, payload: Payload, on_eval: Callable[[int], None] | None = None) -> None:
        self.topo = topo
        self.payload = payload
        self.ref = TopologyRef(topo.name, topo.fingerprint)
        self.simulations = 0
        self.infeasible = 0
        self.pruned = 0
        self._cache: dict[tuple[str, int], float] = {}
        self._on_eval = on_eval
        self._cm = ComputeModel.of(payload, topo)
        self._pair: dict[tuple[int, int], tuple[float, float]] = {}
        self._compute: dict[tuple[int, int | None], float] = {}

    def _pair_cost(self, a: int, b: int) -> tuple[float, float]:
        """(latency_us, bottleneck bytes per microsecond) of the route a -> b, cached."""
        hit = self._pair.get((a, b))
        if hit is None:
            route = self.topo.route(a, b)
            links = self.topo.links
            bw = min((links[i].bw_gbps for i in route), default=math.inf) * 1e3
            hit = self._pair[(a, b)] = (sum(links[i].latency_us for i in route), bw)
        return hit

    def floor_us(self, plan: Plan) -> float:
        """A lower bound on what ``simulate`` predicts for ``plan``, in one pass over its ops.

        Each rank's steps run one after another; a transfer step lasts at least its slowest
        transfer alone on its route (sender overhead, bytes at the route's bottleneck, hop
        latencies), then the step's merges; a COMPUTE lasts exactly its kernel. A
        COLLECTIVE counts as 0. The simulator can only add waiting and sharing to that.
        """
        overhead = self.topo.cost.overhead_us
        cm = self._cm
        sizes: dict[tuple, int] = {}
        worst = 0.0
        for r, prog in enumerate(plan.programs):
            total = 0.0
            step = None
            longest = merged = 0.0
            for op in prog:
                if op.step != step:
                    total += longest + (cm.step_merge_us(r, int(merged)) if merged else 0.0)
                    step, longest, merged = op.step, 0.0, 0.0
                kind = op.kind
                if kind is OpKind.COMPUTE:
                    ck = (r, op.block)
                    longest = self._compute.get(ck, -1.0)
                    if longest < 0:
                        longest = self._compute[ck] = cm.partial_us(r, op.block)
                    continue
                if kind is OpKind.COLLECTIVE:
                    continue
                key = (op.chunk, op.block)
                nbytes = sizes.get(key)
                if nbytes is None:
                    nbytes = sizes[key] = message_bytes(plan, op)
                src, dst = (r, op.peer) if kind is OpKind.SEND else (op.peer, r)
                lat, bw = self._pair_cost(src, dst)
                cost = overhead + lat + nbytes / bw
                if cost > longest:
                    longest = cost
                if kind is OpKind.RECV_MERGE:
                    merged += nbytes
            total += longest + (cm.step_merge_us(r, int(merged)) if merged else 0.0)
            if total > worst:
                worst = total
        return worst

    def plan(self, sched: Schedule, chunks: int) -> Plan:
        """The plan of ``sched`` with ``chunks`` (raises InfeasiblePlanError when it cannot be built)."""
        return build(sched.algorithm, self.payload, self.ref, chunks=chunks, **sched.kwargs)

    def time_us(self, sched: Schedule, chunks: int, cutoff: float = math.inf) -> float:
        """Predicted time of ``sched`` at ``chunks``.

        Args:
            sched: the schedule.
            chunks: its chunk count.
            cutoff: skip the simulation when ``floor_us`` of the plan is already at least
                this (the plan cannot beat it); then ``inf`` is returned and not cached.

        Returns:
            Microseconds; ``inf`` when the builder refuses the parameters or it was pruned.
        """
        key = (sched.key, chunks)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if chunks * sched.rows_per_chunk > self.payload.rows:
            t = math.inf
        else:
            try:
                plan = self.plan(sched, chunks)
            except InfeasiblePlanError:
                self.infeasible += 1
                t = math.inf
            else:
                if cutoff < math.inf and self.floor_us(plan) >= cutoff:
                    self.pruned += 1
                    return math.inf
                t = simulate(plan, self.topo, timeline=False).predicted_us
                self.simulations += 1
                if self._on_eval is not None:
                    self._on_eval(self.simulations)
        self._cache[key] = t
        return t


def sweep_chunks(
    ev: Evaluator,
    sched: Schedule,
    choices: Sequence[int],
    *,
    patience: int = 1,
    start: int | None = None,
    cutoff: Callable[[], float] | None = None,
) -> tuple[int, float]:
    """Best chunk count of ``sched`` among ``choices``, climbing from the smallest.

    Time against chunk count falls while pipelining pays and rises once per-message
    overheads dominate; the sweep stops after ``patience`` choices in a row that do not beat
    the best so far. ``start`` (a choice already known good) is tried first, then its
    neighbours outward.

    Args:
        ev: the evaluator.
        sched: the schedule.
        choices: ascending chunk counts.
        patience: non-improving choices in a row before a direction stops.
        start: a choice to begin from.
        cutoff: returns the time to beat (the search's best so far); plans whose
            ``floor_us`` reaches it are not simulated and count as not improving.

    Returns:
        ``(chunks, predicted_us)``; ``(choices[0], inf)`` when none was built or all were pruned.
    """
    choices = [c for c in choices if c * sched.rows_per_chunk <= ev.payload.rows] or [choices[0]]

    def timed(c: int) -> float:
        return ev.time_us(sched, c, cutoff() if cutoff is not None else math.inf)

    if start is not None and start in choices:
        i0 = choices.index(start)
        best_c, best_t = start, timed(start)
        for direction in (1, -1):
            worse, i = 0, i0 + direction
            while 0 <= i < len(choices) and worse < patience:
                t = timed(choices[i])
                if t < best_t:
                    best_c, best_t, worse = choices[i], t, 0
                else:
                    worse += 1
                i += direction
        return best_c, best_t
    best_c, best_t, worse = choices[0], math.inf, 0
    for c in choices:
        t = timed(c)
        if t < best_t:
            best_c, best_t, worse = c, t, 0
        else:
            worse += 1
            if worse >= patience:
                break
    return best_c, best_t
