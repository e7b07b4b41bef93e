"""The planner: every candidate family, its best chunk count, then local improvement.

Stages (each scored by the simulator through ``Evaluator``):

1. Standard families (star, chain, kary, binomial, butterfly, ring), chunk count swept.
2. Hierarchies over every combination of the topology's domain levels, the shape of each
   level chosen by coordinate descent.
3. Multi-rail forests and double binary trees.
4. Local improvement (re-parent a subtree, swap ranks, lift/push to change a fan-out,
   reroot) of the best single-tree candidates, then a final chunk sweep.

The effort shrinks with the rank count (fewer orders, fan-outs and moves) so that 1,024
ranks plan in under a minute. Everything is seeded and ordered: the same inputs give the
same candidates, the same plan and byte-identical files.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from treeattn.cost.bounds import lower_bounds
from treeattn.errors import InputError
from treeattn.plan.ir import Plan
from treeattn.search.candidates import (
    HIER_SHAPES,
    Layout,
    double_binary_schedules,
    hierarchical_schedule,
    layout_of,
    multirail_schedules,
    standard_schedules,
)
from treeattn.search.evaluate import Evaluator, Schedule, sweep_chunks
from treeattn.search.evaluate import chunk_choices as default_chunk_choices
from treeattn.search.exhaustive import exhaustive_trees
from treeattn.search.moves import hill_climb
from treeattn.topology.model import Topology
from treeattn.workload import Payload, Workload

__all__ = [
    "Candidate",
    "SearchResult",
    "Effort",
    "effort_for",
    "search",
    "baselines",
    "FAMILIES",
    "TREE_FAMILIES",
    "RING_ATTENTION_MAX_RANKS",
]

Progress = Callable[[int, int, str], None]
"""``progress(done, total, stage)``: called as stages advance (the CLI draws a bar)."""

TREE_ALGORITHMS = frozenset({"tree", "star", "chain", "kary", "binomial", "hierarchical"})
FAMILIES = ("star", "chain", "kary", "binomial", "butterfly", "ring", "hierarchical", "multirail", "double-binary",
            "exhaustive")
"""Candidate families ``search`` generates (local improvement adds ``improved`` trees;
``exhaustive`` is the best of all rooted trees, tried where p <= ``Effort.exact_ranks``)."""
TREE_FAMILIES = frozenset({"star", "chain", "kary", "binomial", "hierarchical"})
"""Families whose plans are one tree (reduce up, broadcast down): what moves improve."""
RING_ATTENTION_MAX_RANKS = 256
"""Ring attention moves p(p-1) KV blocks: building and simulating it takes about 0.5 s at
128 ranks, 2.5 s at 256 and 50 s at 1,024, so ``search`` leaves it out of the baselines
above this many ranks (``treeattn compare`` simulates it at any size)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One ranked schedule with its best chunk count."""

    algorithm: str
    """Family: star, chain, kary, binomial, butterfly, ring, hierarchical, multirail,
    double-binary, or ``improved`` (a tree after local moves)."""
    params: dict[str, Any]
    """Short description of the family's parameters (orders named, not listed)."""
    chunks: int
    """Chunks the builder was given (per segment for ring, per tree for forests)."""
    predicted_us: float
    ratio_to_bound: float
    """predicted_us / the lower bound."""
    builder: str = ""
    """The ``treeattn.plan.build`` algorithm that makes its plan."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "params": self.params,
            "chunks": self.chunks,
            "predicted_us": self.predicted_us,
            "ratio_to_bound": self.ratio_to_bound,
            "builder": self.builder,
        }


@dataclass(frozen=True)
class SearchResult:
    """What ``search`` found."""

    best: Plan
    """The winning plan, ``predicted_us`` filled, ``notes['search']`` holding the statistics."""
    candidates: list[Candidate]
    """The top candidates, fastest first (``candidates[0]`` is ``best``)."""
    lower_bound_us: float
    baselines: dict[str, float | None]
    """``allreduce3_nccl_us`` (or ``allreduce_nccl_us`` for raw payloads), ``allgather_merge_us``,
    ``ring_attention_us`` (None where not simulated)."""
    stats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        best = self.candidates[0]
        return {
            "best": {"algorithm": best.algorithm, "builder": best.builder, "params": best.params,
                     "chunks": best.chunks, "predicted_us": best.predicted_us,
                     "ratio_to_bound": best.ratio_to_bound},
            "lower_bound_us": self.lower_bound_us,
            "baselines": self.baselines,
            "candidates": [c.to_dict() for c in self.candidates],
            "stats": self.stats,
        }


@dataclass(frozen=True, slots=True)
class Effort:
    """How hard the search tries; ``effort_for(p)`` picks it from the rank count."""

    small: bool
    """Fewer orders and fan-outs."""
    patience: int
    """Chunk sweep: stop after this many non-improving chunk counts."""
    max_level_sets: int
    """Hierarchies: at most this many combinations of domain levels."""
    hier_shapes: int
    """Hierarchies: how many of HIER_SHAPES the descent tries per level."""
    improve_starts: int
    """Local improvement from this many of the best single trees."""
    improve_budget: int
    """Trees scored per start."""
    per_round: int
    """Moves sampled per round of the climb."""
    sweep_top: int | None = None
    """Chunk sweep only for this many of the best screened schedules (None: all)."""
    slack: float = 1.5
    """Hierarchy descent: shapes whose floor exceeds slack x the best so far are not simulated."""
    kicks: int = 0
    """Local improvement: restarts from the best tree with two random moves when stuck."""
    improve_slack: float | None = None
    """Local improvement starts only from trees within this factor of the best candidate."""
    exact_ranks: int = 5
    """Up to this many ranks, every rooted tree is also tried (``exhaustive_trees``)."""


def effort_for(p: int) -> Effort:
    """The effort level for ``p`` ranks (tuned so 8 ranks plan in < 1 s, 1,024 in < 60 s)."""
    if p <= 16:
        return Effort(False, 2, 8, len(HIER_SHAPES), 3, 240, 48, kicks=6)
    if p <= 64:
        return Effort(False, 2, 8, len(HIER_SHAPES), 2, 60, 20, sweep_top=12, improve_slack=1.5)
    if p <= 256:
        return Effort(True, 1, 4, 3, 1, 16, 8, sweep_top=4, improve_slack=1.2)
    return Effort(True, 1, 3, 2, 1, 4, 4, sweep_top=1, improve_slack=1.2)


def baselines(
    topo: Topology,
    payload: Payload,
    ev: Evaluator | None = None,
    *,
    ring_max_ranks: int | None = RING_ATTENTION_MAX_RANKS,
) -> dict[str, float | None]:
    """Predicted times of what libraries and the paper do, as the simulator times them.

    Returns:
        ``allreduce3_nccl_us`` (attention: the paper's three all-reduces, each timed by the
        NCCL model) or ``allreduce_nccl_us`` (raw: one NCCL all-reduce), ``allgather_merge_us``,
        and ``ring_attention_us`` (attention only; None above ``ring_max_ranks`` ranks, which
        None lifts).
    """
    ev = ev or Evaluator(topo, payload)
    out: dict[str, float | None] = {}
    if isinstance(payload, Workload):
        out["allreduce3_nccl_us"] = ev.time_us(Schedule("allreduce3", "allreduce3", {}), 1)
        out["ring_attention_us"] = (ev.time_us(Schedule("ring-attention", "ring-attention", {}), 1)
                                    if ring_max_ranks is None or topo.num_ranks <= ring_max_ranks else None)
    else:
        out["allreduce_nccl_us"] = ev.time_us(Schedule("allreduce", "allreduce", {}), 1)
    out["allgather_merge_us"] = ev.time_us(Schedule("allgather-merge", "allgather-merge", {}), 1)
    return {k: (None if v is None or math.isinf(v) else v) for k, v in out.items()}


class _Pool:
    """Scored schedules, first come first kept on ties (deterministic ranking)."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[Schedule, int, float, int]] = {}
        self.best_t = math.inf

    def add(self, sched: Schedule, chunks: int, t: float) -> None:
        if math.isinf(t):
            return
        old = self.items.get(sched.key)
        if old is None or t < old[2]:
            self.items[sched.key] = (sched, chunks, t, old[3] if old else len(self.items))
        self.best_t = min(self.best_t, t)

    def get(self, key: str, default: tuple[int, float]) -> tuple[int, float]:
        hit = self.items.get(key)
        return (hit[1], hit[2]) if hit else default

    def top_keys(self, k: int) -> set[str]:
        return {s.key for s, _, _ in self.ranked()[:k]}

    def ranked(self) -> list[tuple[Schedule, int, float]]:
        return [(s, c, t) for s, c, t, _ in sorted(self.items.values(), key=lambda x: (x[2], x[3]))]


def _level_sets(lay: Layout, limit: int) -> list[tuple[int, ...]]:
    n = len(lay.levels)
    sets = [s for k in range(1, n + 1) for s in itertools.combinations(range(n), k)]
    # Prefer the finest levels together first: they are where hierarchy pays most.
    sets.sort(key=lambda s: (-len(s) if len(s) <= 2 else len(s), s))
    return sets[:limit]


def search(
    topo: Topology,
    workload: Payload,
    *,
    seed: int = 0,
    top_k: int = 10,
    chunk_choices: tuple[int, ...] | None = None,
    progress: Progress | None = None,
    effort: Effort | None = None,
    families: Collection[str] | None = None,
) -> SearchResult:
    """Find the fastest reduction schedule for ``workload`` on ``topo`` (every rank gets the result).

    Args:
        topo: the topology (its rank count must match the workload's).
        workload: a decode shape (the merge of attention partials) or a raw payload (a sum).
        seed: seeds the local-improvement moves; same seed, same result.
        top_k: candidates returned.
        chunk_choices: chunk counts to try (default: powers of two up to the rows).
        progress: ``progress(done, total, stage)`` callback.
        effort: override ``effort_for(p)``.
        families: only these candidate families (``FAMILIES``; ``TREE_FAMILIES`` for
            single trees only); default all.

    Returns:
        The SearchResult: the best Plan (``predicted_us`` and ``notes['search']`` set), the
        ranked candidates with their ratio to the lower bound, the bound and the baselines.

    Examples:
        >>> from treeattn.topology.library import resolve
        >>> from treeattn.workload import Workload
        >>> topo = resolve("dgx-h100")
        >>> w = Workload.create(ranks=8, seq_len=131072, model="llama-3.1-8b")
        >>> res = search(topo, w)
        >>> res.best.predicted_us == res.candidates[0].predicted_us
        True
    """
    p = topo.num_ranks
    if workload.ranks != p:
        raise InputError(f"the workload has {workload.ranks} ranks but topology {topo.name!r} places {p}")
    eff = effort or effort_for(p)
    choices = tuple(chunk_choices) if chunk_choices else default_chunk_choices(workload, p)
    if any((not isinstance(c, int)) or c < 1 for c in choices):
        raise InputError(f"chunk choices must be positive integers, got {list(choices)}")
    choices = tuple(sorted(set(choices)))
    rng = random.Random(seed)
    lay = layout_of(topo)
    ev = Evaluator(topo, workload)
    bound = lower_bounds(workload, topo)
    pool = _Pool()

    standard = standard_schedules(lay, workload, small=eff.small)
    level_sets = _level_sets(lay, eff.max_level_sets)
    hier_start = [(ids, [("star", 2)] * len(ids) + [("binomial", 2)]) for ids in level_sets]
    forests = multirail_schedules(lay, small=eff.small) + double_binary_schedules(lay)
    screen = standard + [hierarchical_schedule(lay, ids, shapes) for ids, shapes in hier_start] + forests
    if families is not None:
        unknown = sorted(set(families) - set(FAMILIES))
        if unknown:
            raise InputError(f"unknown candidate families {unknown}; choose from {', '.join(FAMILIES)}")
        screen = [s for s in screen if s.family in families]
        if "hierarchical" not in families:
            hier_start = []
    total = 2 * len(screen) + len(level_sets) + eff.improve_starts + 1
    done = 0

    def tick(stage: str, n: int = 1) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(min(done, total), total, stage)

    def best_so_far() -> float:
        return pool.best_t

    # 1. screen every family at the smallest chunk count, most promising (lowest floor) first
    c0 = choices[0]
    floors = []
    for i, sched in enumerate(screen):
        floors.append((ev.screen_floor_us(sched, c0), i))
        tick("screening")
    order = [screen[i] for _, i in sorted(floors)]
    for sched in order:
        pool.add(sched, c0, ev.time_us(sched, c0, best_so_far()))
    # 2. chunk sweep of the best screened schedules (and of the unscreenable ones when all are tried)
    for k, sched in enumerate(order):
        if eff.sweep_top is None or k < eff.sweep_top or sched.key in pool.top_keys(eff.sweep_top):
            c, t = sweep_chunks(ev, sched, choices, patience=eff.patience, cutoff=best_so_far)
            pool.add(sched, c, t)
        tick("chunk counts")

    # 3. hierarchies: coordinate descent over the shape of each level
    for level_ids, shapes in hier_start:
        cur = hierarchical_schedule(lay, level_ids, shapes)
        cur_c, cur_t = pool.get(cur.key, (c0, math.inf))
        for j in range(len(shapes)):
            for alt in HIER_SHAPES[: eff.hier_shapes]:
                if alt == shapes[j]:
                    continue
                trial = shapes[:j] + [alt] + shapes[j + 1:]
                sched = hierarchical_schedule(lay, level_ids, trial)
                t = ev.time_us(sched, cur_c, min(cur_t, pool.best_t * eff.slack))
                pool.add(sched, cur_c, t)
                if t < cur_t:
                    shapes, cur, cur_t = trial, sched, t
        c, t = sweep_chunks(ev, cur, choices, patience=eff.patience, start=cur_c, cutoff=best_so_far)
        pool.add(cur, c, t)
        tick("hierarchies")

    # 4. local improvement of the best single trees
    climbs: list[dict[str, Any]] = []
    moves_of: dict[str, list[str]] = {}
    limit = pool.best_t * eff.improve_slack if eff.improve_slack is not None else math.inf
    starts = [x for x in pool.ranked() if x[0].algorithm in TREE_ALGORITHMS and x[2] <= limit][: eff.improve_starts]
    near = lay.near
    climb = {"cutoff": math.inf, "chunks": 1}

    def score(tree: tuple[int, ...]) -> float:
        # Trees that cannot beat the climb's current one are not simulated.
        return ev.time_us(Schedule("improved", "tree", {"parents": list(tree)}), climb["chunks"], climb["cutoff"])

    def accepted(t: float) -> None:
        climb["cutoff"] = t

    for sched, c, t in starts:
        par = tuple(ev.plan(sched, c).params["parents"])
        climb.update(cutoff=t, chunks=c)
        res = hill_climb(par, score, rng, budget=eff.improve_budget, per_round=eff.per_round, near=near,
                         start_score=t, on_move=accepted, kicks=eff.kicks)
        climbs.append({"from": sched.family, "describe": sched.describe, "start_us": t, "end_us": res.score,
                       "trees_scored": res.evaluated, "moves": len(res.accepted)})
        if res.accepted:
            improved = Schedule("improved", "tree", {"parents": list(res.par)},
                                {"from": sched.family, **sched.describe, "moves": len(res.accepted)})
            c2, t2 = sweep_chunks(ev, improved, choices, patience=eff.patience, start=c, cutoff=best_so_far)
            pool.add(improved, c2, min(t2, res.score) if c2 == c else t2)
            moves_of[improved.key] = list(res.accepted)
        tick("local improvement")

    # 5. exact where cheap: every rooted tree (pruned against the best so far)
    if p <= eff.exact_ranks and (families is None or "exhaustive" in families):
        ex = exhaustive_trees(topo, workload, chunk_choices=choices, evaluator=ev, cutoff=pool.best_t)
        if ex.parents:
            pool.add(Schedule("exhaustive", "tree", {"parents": list(ex.parents)},
                              {"root": ex.parents.index(-1), "trees": ex.trees}), ex.chunks, ex.predicted_us)

    ranked = pool.ranked()
    if not ranked:
        raise InputError(f"no schedule could be built for {p} ranks and {workload.rows} rows")
    base = baselines(topo, workload, ev)
    tick("baselines")
    bound_us = bound.bound_us

    def ratio(t: float) -> float:
        return t / bound_us if bound_us > 0 else math.inf

    cands: list[Candidate] = []
    shown: set[tuple[str, int, float]] = set()
    for s, c, t in ranked:
        # Shapes that coincide on this topology (a "star" of two leaders is also their chain) give
        # the same plan and time: list it once.
        if (s.family, c, t) in shown:
            continue
        shown.add((s.family, c, t))
        cands.append(Candidate(s.family, s.describe, c, t, ratio(t), s.algorithm))
        if len(cands) >= max(1, top_k):
            break
    top_sched, top_c, top_t = ranked[0]
    plan = ev.plan(top_sched, top_c)
    stats = {
        "seed": seed,
        "screened": len(screen),
        "schedules": len(pool.items),
        "simulations": ev.simulations,
        "pruned": ev.pruned,
        "chunk_choices": list(choices),
        "levels": [kind for kind, _ in lay.levels],
        "climbs": climbs,
    }
    notes = dict(plan.notes)
    notes["search"] = {
        "family": top_sched.family,
        "describe": top_sched.describe,
        "lower_bound_us": bound_us,
        "bound_cut": bound.cut,
        "ratio_to_bound": ratio(top_t),
        "baselines": base,
        **{k: v for k, v in stats.items() if k != "climbs"},
    }
    if top_sched.key in moves_of:
        notes["search"]["moves"] = moves_of[top_sched.key]
    plan = _with(plan, predicted_us=top_t, notes=notes)
    return SearchResult(plan, cands, bound_us, base, stats)


def _with(plan: Plan, **changes: Any) -> Plan:
    from dataclasses import replace

    return replace(plan, **changes)
