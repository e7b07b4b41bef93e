"""Scoring schedules: build the plan, time it with the simulator, remember the answer.

Every time the search compares comes from ``treeattn.cost.simulate`` on the plan the
builders make, so a candidate's ``predicted_us`` is exactly what ``treeattn sim`` would say
about its plan file. The cache key is the builder call (algorithm, its arguments, chunks).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treeattn.cost.compute import ComputeModel
from treeattn.cost.nccl_rates import pair_rate_gbps
from treeattn.cost.program import _COMPUTE, _RECV_COPY, _RECV_MERGE, _SEND, Program, compile_plan
from treeattn.cost.simulate import issues_by_peer, simulate
from treeattn.errors import InfeasiblePlanError
from treeattn.plan.builders import build
from treeattn.plan.ir import Plan, TopologyRef, row_quantum
from treeattn.search.plancache import KeptPlans
from treeattn.topology.model import Topology
from treeattn.workload import Payload, Workload

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
    chain_steps: int = 0
    """A dependency chain of at least ``chain_steps + chunks - 1`` transfer steps runs through
    the plan (ring: 2p - 2, chain: 2p - 2); each costs at least the sender overhead, so such
    plans are pruned before they are even built."""

    @property
    def key(self) -> str:
        return self.algorithm + json.dumps(self.kwargs, sort_keys=True, separators=(",", ":"))


def chunk_choices(payload: Payload, ranks: int, limit: int | None = None) -> tuple[int, ...]:
    """Chunk counts to try: powers of two up to the payload's whole quanta of rows (and ``limit``).

    Args:
        payload: the workload; its rows in 16-byte quanta (``plan.ir.row_quantum``) cap the
            chunk count: more chunks than quanta would start some on rows a GPU kernel copies
            in and out (``plan.ir.chunk_rows``), which the simulator does not charge.
        ranks: p; large rank counts get a lower cap, as every chunk multiplies the ops.
        limit: an explicit cap.

    Returns:
        ``(1, 2, 4, ...)``.
    """
    cap = 64 if ranks <= 64 else 32 if ranks <= 256 else 16
    if limit is not None:
        cap = min(cap, limit)
    cap = max(1, min(cap, payload.rows // row_quantum(payload)))
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
        self._pair: dict[int, tuple[float, float]] = {}
        self._pair_arrays = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))
        """``_pair``'s keys sorted, with their latencies and rates (``_pair_costs``)."""
        self._floors: dict[tuple[str, int], float] = {}
        self._compute: dict[tuple[int, int | None, bool], float] = {}
        self._min_c: float | None = None
        self._kept = KeptPlans()
        """Plans built for ``screen_floor_us``, waiting for ``time_us`` (``plancache``)."""

    def _pair_cost(self, a: int, b: int) -> tuple[float, float]:
        """(latency_us, bottleneck bytes per microsecond) of the route a -> b at the rates
        transfers reach (``treeattn.cost.nccl_rates.pair_rate_gbps``, as the
        simulator drains them), cached."""
        key = a * self.topo.num_ranks + b
        hit = self._pair.get(key)
        if hit is None:
            route = self.topo.route(a, b)
            hit = self._pair[key] = (sum(self.topo.links[i].latency_us for i in route),
                                     pair_rate_gbps(self.topo, a, b) * 1e3)
        return hit

    def floor_us(self, plan: Plan) -> float:
        """A lower bound on what ``simulate`` predicts for ``plan``: its critical path without contention.

        It reads the plan as the simulator does (``treeattn.cost.program.compile_plan``) and
        charges what the simulator charges, less what contention and waiting add: nodes are
        the steps of each rank; a step is posted when the rank's previous step ends; an empty
        message costs nothing (it is not sent); a transfer starts once both of its steps are
        posted and lasts at least the sender's
        overhead, its bytes at the route's bottleneck rate and the route's hop latencies (what
        it costs alone on the network); a step whose rank issues m messages lasts at least m
        overheads plus the cheapest of them (one at a time; on GPUs m counts the peers it sends
        to or receives from, one group each: ``treeattn.cost.simulate.issues_by_peer``); a step's
        COMPUTE lasts its kernel (``ComputeModel.partial_us``); a step ends after its
        transfers and compute, plus its local work (``treeattn.cost.program``,
        ``ComputeModel.step_local_us``: the simulator's own); a COLLECTIVE step counts as 0.
        The simulator only adds link sharing, issue waits, collective waits, the wake-up and host CPU queueing to that,
        so the longest path here never exceeds its prediction. Plans whose transfers join steps
        of one number (``steps_aligned``) are timed a step number at a time in arrays
        (``_floor_by_step``), others step by step in dependency order (``_floor_any``); the two
        give identical results where both apply.
        """
        p = self.topo.num_ranks
        prog = compile_plan(plan, p, self._cm)
        partner = prog.pair(p)
        nodes = _node_arrays(prog)
        if steps_aligned(prog, partner, nodes):
            return self._floor_by_step(prog, partner, nodes)
        return self._floor_any(prog, partner)

    def _pair_costs(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``_pair_cost`` of many rank pairs: (latencies, bytes per microsecond)."""
        p = self.topo.num_ranks
        keys, inverse = np.unique(src * p + dst, return_inverse=True)
        # The pairs costed so far, as sorted arrays beside ``_pair``: a search's candidates
        # send over mostly the same pairs, so most are looked up here at once.
        known, known_lat, known_bw = self._pair_arrays
        at = np.searchsorted(known, keys)
        hit = at < len(known)
        hit[hit] = known[at[hit]] == keys[hit]
        if not hit.all():
            new = keys[~hit]
            costs = [self._pair_cost(k // p, k % p) for k in new.tolist()]
            merged = np.concatenate([known, new])
            order = np.argsort(merged, kind="stable")
            known = merged[order]
            known_lat = np.concatenate([known_lat, np.array([c[0] for c in costs], dtype=np.float64)])[order]
            known_bw = np.concatenate([known_bw, np.array([c[1] for c in costs], dtype=np.float64)])[order]
            self._pair_arrays = (known, known_lat, known_bw)
            at = np.searchsorted(known, keys)
        return known_lat[at][inverse], known_bw[at][inverse]

    def _floor_by_step(self, prog: Program, partner_list: list[int], nodes: _Nodes | None = None) -> float:
        """``floor_us`` of a plan whose transfers join steps of one number on both sides
        (``steps_aligned``; every builder's): the steps of each number depend only on steps of
        smaller numbers, so they are timed together, in arrays, with the arithmetic of
        ``_floor_any`` (the same results, bit for bit); ``nodes``: ``_node_arrays(prog)`` where
        the caller has them."""
        kind, node_of, node_step = nodes or _node_arrays(prog)
        sends = np.flatnonzero(kind == _SEND)
        partner = np.array(partner_list, dtype=np.int64)
        cm, overhead = self._cm, self.topo.floor_overhead_us
        count = len(node_step)
        rank_of = np.array(prog.rank_of, dtype=np.int64)
        peer = np.array(prog.peer, dtype=np.int64)
        nbytes = np.array(prog.nbytes, dtype=np.int64)
        node_rank = np.repeat(np.arange(len(prog.steps)), [len(steps) for steps in prog.steps])
        first = np.ones(count, dtype=bool)
        first[1:] = node_rank[1:] != node_rank[:-1]
        # COMPUTE: a rank's later ones pay the later launch.
        fixed = np.zeros(count)
        compute = self._compute
        last = -1
        blocks = prog.block
        for g in np.flatnonzero(kind == _COMPUTE).tolist():
            r = prog.rank_of[g]
            n = int(node_of[g])
            ck = (r, None if blocks[g] < 0 else blocks[g], last == r)
            f = compute.get(ck)
            if f is None:
                f = compute[ck] = cm.partial_us(r, ck[1], later=ck[2])
            fixed[n] = f
            last = r
        # A step issues m > 1 messages (by peer, both sides: ``issues_by_peer``) one at a time.
        issued = np.zeros(count)
        grouped = issues_by_peer(self.topo)
        # (an empty message is not sent: it costs nothing)
        xs = np.flatnonzero((kind == _SEND) | (kind == _RECV_MERGE) | (kind == _RECV_COPY)) if grouped else sends
        xs = xs[nbytes[xs] > 0]
        if len(xs):
            out = kind[xs] == _SEND
            lat, bw = self._pair_costs(np.where(out, rank_of[xs], peer[xs]), np.where(out, peer[xs], rank_of[xs]))
            rest = lat + nbytes[xs] / bw
            at = node_of[xs]
            starts = np.flatnonzero(np.r_[True, at[1:] != at[:-1]])
            nodes = at[starts]
            if grouped:
                own = peer[xs] != rank_of[xs]
                ranks = len(prog.steps)
                groups = np.unique(at[own] * ranks + peer[xs][own])  # (node, peer), once each
                sent = np.bincount(groups // ranks, minlength=count)[nodes]
            else:
                sent = np.diff(np.r_[starts, len(at)])
            cheapest = np.minimum.reduceat(rest, starts)
            many = sent > 1
            issued[nodes[many]] = sent[many] * overhead + cheapest[many]
        mb = np.fromiter(itertools.chain.from_iterable(prog.merge_b), dtype=np.int64, count=count)
        mk = np.fromiter(itertools.chain.from_iterable(prog.merge_k), dtype=np.int64, count=count)
        local = cm.step_local_many_us(node_rank, mb, mk)
        # Transfers: both ends wait for the later of the two posts, then its cost.
        live = sends[(partner[sends] >= 0) & (nbytes[sends] > 0)]
        ea, eb = node_of[live], node_of[partner[live]]
        if len(live):
            lat, bw = self._pair_costs(rank_of[live], rank_of[partner[live]])
            cost = overhead + lat + nbytes[live] / bw
        else:
            cost = np.zeros(0)
        order = np.argsort(node_step, kind="stable")
        bounds_n = np.flatnonzero(np.r_[True, node_step[order][1:] != node_step[order][:-1], True])
        e_order = np.argsort(node_step[ea], kind="stable")
        ea, eb, cost = ea[e_order], eb[e_order], cost[e_order]
        e_step = node_step[ea]
        end = np.zeros(count)
        post = np.zeros(count)
        base = np.maximum(fixed, issued)
        e_at = 0
        for i in range(len(bounds_n) - 1):
            idx = order[bounds_n[i]:bounds_n[i + 1]]
            step = node_step[idx[0]]
            post[idx] = np.where(first[idx], 0.0, end[idx - 1])
            t = post[idx] + base[idx]
            end[idx] = t
            e_to = e_at + int(np.searchsorted(e_step[e_at:], step, side="right"))
            if e_to > e_at:
                a, b = ea[e_at:e_to], eb[e_at:e_to]
                x = np.maximum(post[a], post[b]) + cost[e_at:e_to]
                np.maximum.at(end, a, x)
                np.maximum.at(end, b, x)
                e_at = e_to
            end[idx] += local[idx]
        return max(0.0, float(end.max())) if count else 0.0

    def _floor_any(self, prog: Program, partner: list[int]) -> float:
        """``floor_us`` of any plan: one pass over the ops, then one over the steps in dependency order."""
        p = self.topo.num_ranks
        overhead = self.topo.floor_overhead_us
        grouped = issues_by_peer(self.topo)
        cm = self._cm
        kind, nbytes, rank_of, ops = prog.kind, prog.nbytes, prog.rank_of, prog.ops
        fixed: list[float] = []
        issued: list[float] = []
        local: list[float] = []
        first: list[bool] = []
        node_rank: list[int] = []
        node_of = [0] * len(kind)
        compute = self._compute
        for r in range(p):
            computed = False
            for c, (lo, hi) in enumerate(prog.steps[r]):
                n = len(fixed)
                first.append(c == 0)
                node_rank.append(r)
                cg = prog.step_compute[r][c]
                f = 0.0
                if cg >= 0:
                    ck = (r, ops[cg].block, computed)
                    f = compute.get(ck)
                    if f is None:
                        f = compute[ck] = cm.partial_us(r, ops[cg].block, later=computed)
                    computed = True
                sent = 0
                peers = set()
                cheapest = math.inf
                for gid in range(lo, hi):
                    node_of[gid] = n
                    k = kind[gid]
                    if nbytes[gid] and (k == _SEND or (grouped and (k == _RECV_MERGE or k == _RECV_COPY))):
                        q = ops[gid].peer
                        rest = self._pair_cost(r, q) if k == _SEND else self._pair_cost(q, r)
                        rest = rest[0] + nbytes[gid] / rest[1]
                        sent += 1
                        if q != r:
                            peers.add(q)
                        if rest < cheapest:
                            cheapest = rest
                if grouped:
                    sent = len(peers)
                fixed.append(f)
                issued.append(sent * overhead + cheapest if sent > 1 else 0.0)
                mb = prog.merge_b[r][c]
                local.append(cm.step_local_us(r, mb, prog.merge_k[r][c]) if mb else 0.0)
        count = len(fixed)
        partners: list[list[tuple[int, float]]] = [[] for _ in range(count)]
        for gid, code in enumerate(kind):
            q = partner[gid]
            if code == _SEND and q >= 0 and nbytes[gid]:
                lat, bw = self._pair_cost(rank_of[gid], rank_of[q])
                cost = overhead + lat + nbytes[gid] / bw
                na, nb = node_of[gid], node_of[q]
                partners[na].append((nb, cost))
                partners[nb].append((na, cost))
        # Node n waits for its own previous step and for each partner's previous step.
        indeg = [0] * count
        dependents: list[list[int]] = [[] for _ in range(count)]
        for n in range(count):
            if not first[n]:
                indeg[n] += 1
                dependents[n - 1].append(n)
            for m, _ in partners[n]:
                if not first[m]:
                    indeg[n] += 1
                    dependents[m - 1].append(n)
        end = [0.0] * count
        ready = [n for n in range(count) if indeg[n] == 0]
        worst = 0.0
        while ready:
            n = ready.pop()
            post = 0.0 if first[n] else end[n - 1]
            t = post + (fixed[n] if fixed[n] > issued[n] else issued[n])
            for m, cost in partners[n]:
                other = 0.0 if first[m] else end[m - 1]
                x = (post if post > other else other) + cost
                if x > t:
                    t = x
            t += local[n]
            end[n] = t
            if t > worst:
                worst = t
            for d in dependents[n]:
                indeg[d] -= 1
                if indeg[d] == 0:
                    ready.append(d)
        return worst

    def _min_compute(self) -> float:
        if self._min_c is None:
            self._min_c = min(self._cm.partial_us(r) for r in range(self.topo.num_ranks)) if isinstance(
                self.payload, Workload) else 0.0
        return self._min_c

    def plan(self, sched: Schedule, chunks: int) -> Plan:
        """The plan of ``sched`` with ``chunks`` (raises InfeasiblePlanError when it cannot be built)."""
        return build(sched.algorithm, self.payload, self.ref, chunks=chunks, **sched.kwargs)

    def chain_floor_us(self, sched: Schedule, chunks: int) -> float:
        """What ``sched.chain_steps`` alone proves, without building the plan (0 when unknown)."""
        if not sched.chain_steps:
            return 0.0
        return self._min_compute() + (sched.chain_steps + chunks - 1) * self.topo.floor_overhead_us

    def screen_floor_us(self, sched: Schedule, chunks: int) -> float:
        """``floor_us`` of the plan (cached), or the chain floor for schedules that say they are
        long (not worth building to rank them); ``inf`` when it cannot be built."""
        if sched.chain_steps:
            return self.chain_floor_us(sched, chunks)
        return self._floor(sched, chunks, None, keep=True)

    def _floor(self, sched: Schedule, chunks: int, plan: Plan | None, keep: bool = False) -> float:
        key = (sched.key, chunks)
        f = self._floors.get(key)
        if f is None:
            if plan is None:
                try:
                    plan = self.plan(sched, chunks)
                except InfeasiblePlanError:
                    self._floors[key] = math.inf
                    return math.inf
            f = self._floors[key] = self.floor_us(plan)
            if keep and key not in self._cache:
                # floor_us compiled it (the Program stays with the plan): the simulation reuses both
                self._kept.keep(key, f, len(compile_plan(plan, self.topo.num_ranks, self._cm).kind), plan)
        return f

    def time_us(self, sched: Schedule, chunks: int, cutoff: float = math.inf) -> float:
        """Predicted time of ``sched`` at ``chunks``.

        Args:
            sched: the schedule.
            chunks: its chunk count.
            cutoff: skip the simulation when a floor of the plan (``chain_floor_us``, then
                ``floor_us``) already reaches this (the plan cannot beat it); then ``inf`` is
                returned and not cached.

        Returns:
            Microseconds; ``inf`` when the builder refuses the parameters or it was pruned.
        """
        key = (sched.key, chunks)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if chunks * sched.rows_per_chunk > self.payload.rows:
            self._cache[key] = math.inf
            return math.inf
        if cutoff < math.inf:
            known = self._floors.get(key)
            if self.chain_floor_us(sched, chunks) >= cutoff or (known is not None and known >= cutoff):
                self.pruned += 1
                self._kept.drop(key)
                return math.inf
        try:
            kept = self._kept.take(key)
            plan = kept if kept is not None else self.plan(sched, chunks)
        except InfeasiblePlanError:
            self.infeasible += 1
            self._cache[key] = math.inf
            return math.inf
        if cutoff < math.inf and self._floor(sched, chunks, plan) >= cutoff:
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


_Nodes = tuple[np.ndarray, np.ndarray, np.ndarray]


def _node_arrays(prog: Program) -> _Nodes:
    """Per op its kind code and its node (the index of its rank's step among all steps);
    per node its step number."""
    kind = np.array(prog.kind, dtype=np.int8)
    sizes = [hi - lo for steps in prog.steps for lo, hi in steps]
    node_of = np.repeat(np.arange(len(sizes)), sizes)
    node_step = np.fromiter(itertools.chain.from_iterable(prog.step_no), dtype=np.int64, count=len(sizes))
    return kind, node_of, node_step


def steps_aligned(prog: Program, partner: list[int], nodes: _Nodes | None = None) -> bool:
    """Whether every matched transfer joins steps of one number on its two ranks (``nodes``:
    ``_node_arrays(prog)`` where the caller has them)."""
    kind, node_of, node_step = nodes or _node_arrays(prog)
    sends = np.flatnonzero(kind == _SEND)
    mates = np.array(partner, dtype=np.int64)[sends]
    live = mates >= 0
    return bool(np.array_equal(node_step[node_of[sends[live]]], node_step[node_of[mates[live]]]))
