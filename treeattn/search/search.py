"""The planner: every candidate family at its best chunk count, then local improvement.

Stages, every time a simulator prediction (``Evaluator.time_us``):

1. Screen: every candidate (standard families, a hierarchy per combination of domain
   levels, multi-rail forests, double binary trees, direct exchanges) at the smallest chunk count, in order
   of its contention-free floor (``Evaluator.floor_us``), so that a good time is known early
   and candidates whose floor already exceeds it are never simulated (exact pruning).
2. Chunk sweep of the best screened candidates (all of them up to 16 ranks).
3. Hierarchies: coordinate descent over the tree shape used at each level.
4. Local improvement of the best single trees: re-parent a subtree, swap ranks, lift or
   push (change a fan-out), reroot; seeded hill climbing with kicks, then a chunk sweep.
5. Exact where cheap: the best of all p^(p-1) rooted trees for p <= 5.

The effort shrinks with the rank count (``effort_for``: fewer orders, fan-outs, sweeps and
moves) so that 1,024 ranks plan in well under a minute. Everything is seeded and ordered:
the same inputs give the same candidates, plan and bytes.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

from treeattn.cost.bounds import heads_shares, lower_bounds
from treeattn.cost.memory import DEFAULT_MEM_FRACTION, MemoryCheck, check_kv_fits, memory_check
from treeattn.errors import InputError
from treeattn.plan.baselines import baselines_for
from treeattn.plan.bits import bit_groups
from treeattn.plan.builders import ALGORITHMS
from treeattn.plan.ir import Plan, gc_paused
from treeattn.plan.trees import reroot, rotated
from treeattn.search.candidates import (
    HIER_SHAPES,
    Layout,
    direct_schedules,
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
from treeattn.search.result import RING_ATTENTION_MAX_RANKS, Candidate, SearchResult, baselines
from treeattn.topology.model import Topology
from treeattn.units import counted
from treeattn.workload import Payload, Workload

__all__ = [
    "Candidate",
    "SearchResult",
    "Effort",
    "effort_for",
    "check_ranks",
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
            "direct", "exhaustive")
"""Candidate families ``search`` generates (local improvement adds ``improved`` trees;
``exhaustive`` is the best of all rooted trees, tried where p <= ``Effort.exact_ranks``)."""
TREE_FAMILIES = frozenset({"star", "chain", "kary", "binomial", "hierarchical"})
"""Families whose plans are one tree (reduce up, broadcast down): what moves improve."""
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


def for_result(sched: Schedule, p: int, result: str, root: int | None) -> Schedule | None:
    """``sched`` made for another result layout (None where its algorithm cannot deliver it):
    ``heads`` reduces each rank's rows along the schedule's tree re-rooted at that rank;
    ``root`` re-roots the one tree at ``root``."""
    if result == "all":
        return sched
    spec = ALGORITHMS[sched.algorithm]
    if result not in spec.results or (result == "heads" and sched.kwargs.get("groups") is not None
                                      and sched.algorithm == "direct"):
        return None
    kw = dict(sched.kwargs, result=result)
    describe = dict(sched.describe)
    if result == "root":
        assert root is not None
        if kw.get("order") is not None:
            kw["order"] = rotated(kw["order"], root)
        elif sched.algorithm == "tree":
            kw["parents"] = reroot(kw["parents"], root)
        else:
            kw["root"] = root
        if "root" in describe:
            describe["root"] = root
        return replace(sched, kwargs=kw, describe=describe)
    kw.pop("root", None)
    describe.pop("root", None)
    # Each rank's rows are one segment: p segments of ``chunks`` pieces; a chain or ring
    # reduce-scatter still runs p - 1 transfers deep.
    return replace(sched, kwargs=kw, describe=describe, rows_per_chunk=p,
                   chain_steps=p - 1 if sched.chain_steps else 0)


def whole_rows(sched: Schedule) -> Schedule | None:
    """``sched``'s all plan in one chunk, each rank keeping its own heads (``build``'s
    ``whole_rows``), for a heads search; None where its algorithm builds no all plan of one
    chunk (a ring's has p segments, a multirail forest's one chunk a tree)."""
    if "all" not in ALGORITHMS[sched.algorithm].results or sched.rows_per_chunk != 1:
        return None
    return replace(sched, kwargs=dict(sched.kwargs, result="heads", whole_rows=True),
                   describe=dict(sched.describe, rows="whole"))


def check_ranks(workload: Payload, topo: Topology) -> None:
    """Refuse a workload made for another rank count than ``topo`` places (read past its
    split's end, it would fail unnamed)."""
    if workload.ranks != topo.num_ranks:
        raise InputError(f"the workload has {workload.ranks} ranks but topology {topo.name!r} places "
                         f"{topo.num_ranks}; make it for {topo.num_ranks} ranks")


def search(
    topo: Topology,
    workload: Payload,
    *,
    result: str = "all",
    root: int | None = None,
    mem_fraction: float | None = DEFAULT_MEM_FRACTION,
    seed: int = 0,
    top_k: int = 10,
    chunk_choices: tuple[int, ...] | None = None,
    progress: Progress | None = None,
    effort: Effort | None = None,
    families: Collection[str] | None = None,
) -> SearchResult:
    """Find the fastest reduction schedule for ``workload`` on ``topo`` for a result layout.

    Args:
        topo: the topology (its rank count must match the workload's).
        workload: a decode shape (the merge of attention partials) or a raw payload (a sum).
        result: ``all`` (every rank gets every row), ``heads`` (each rank its own query
            heads) or ``root`` (rank ``root`` only); ``treeattn.plan.baselines.parse_result``.
        root: the root rank of ``root`` (default 0).
        mem_fraction: the share of each device's memory a rank may use (``mem_gb`` x this);
            schedules whose peak exceeds it are left out of the pick. None: memory unchecked.
        seed: seeds the local-improvement moves; same seed, same result.
        top_k: candidates returned.
        chunk_choices: chunk counts to try (default: powers of two up to the rows); under
            ``heads``, pieces of one rank's rows, so at most the rows over the ranks.
        progress: ``progress(done, total, stage)`` callback.
        effort: override ``effort_for(p)``.
        families: only these candidate families (``FAMILIES``; ``TREE_FAMILIES`` for
            single trees only); default all.

    Returns:
        The SearchResult: the best Plan (``predicted_us`` and ``notes['search']`` set), the
        ranked candidates with their ratio to the lower bound and peak memory, the bound,
        the baselines, and what was left out for memory.

    Raises:
        InputError: bad arguments, or a rank's KV cache alone exceeds its device's memory
            (``treeattn.cost.memory.check_kv_fits``), or no schedule fits.

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
    check_ranks(workload, topo)
    if families is not None:
        unknown = sorted(set(families) - set(FAMILIES))
        if unknown:
            raise InputError(f"unknown candidate families {unknown}; choose from {', '.join(FAMILIES)}")
    if result not in ("all", "heads", "root"):
        raise InputError(f"result must be all, heads or root, got {result!r}")
    if result == "root":
        root = 0 if root is None else root
        if type(root) is not int or not 0 <= root < p:
            raise InputError(f"root {root!r} is out of range: there are {p} ranks")
    # Read once: an iterator is spent by its first reading.
    choices = tuple(chunk_choices) if chunk_choices is not None else default_chunk_choices(workload, p)
    if not choices:
        raise InputError("chunk choices must name at least one chunk count (None: the default)")
    if any(type(c) is not int or c < 1 for c in choices):
        raise InputError(f"chunk choices must be positive integers, got {list(choices)}")
    if max(choices) > workload.rows:
        # No schedule cuts rows finer than one a chunk: the search would drop the choice unsaid.
        raise InputError(f"chunk choice {max(choices)} exceeds the payload's {workload.rows} rows")
    if mem_fraction is not None:
        check_kv_fits(workload, topo, mem_fraction)
    if result == "heads":
        units = workload.q_heads if isinstance(workload, Workload) else workload.rows
        if p > units:
            what = counted(units, "query head" if isinstance(workload, Workload) else "element")
            raise InputError(f"result heads gives every rank its own share: {what} cannot go to {p} ranks")
        # chunks count the pieces of one rank's rows here: the default's too many are dropped,
        # a caller's refused (the search would try (1,) instead, unsaid)
        over = [c for c in choices if c * p > workload.rows]
        if chunk_choices is not None and over:
            raise InputError(f"chunk choice {max(over)} exceeds the {workload.rows // p} rows a rank keeps of "
                             f"result heads ({workload.rows} rows over {p} ranks)")
        choices = tuple(c for c in choices if c * p <= workload.rows) or (1,)
    with gc_paused():
        run = _Run(topo, workload, effort or effort_for(p), tuple(sorted(set(choices))), seed, families, progress,
                   result, root, mem_fraction)
        run.screen()
        run.sweep()
        run.hierarchies()
        run.improve()
        run.exact()
        return run.result(top_k)


class _Run:
    """One search's state: the evaluator, the pool of scored schedules and the stage methods."""

    def __init__(self, topo: Topology, workload: Payload, eff: Effort, choices: tuple[int, ...], seed: int,
                 families: Collection[str] | None, progress: Progress | None, result: str = "all",
                 root: int | None = None, mem_fraction: float | None = DEFAULT_MEM_FRACTION) -> None:
        self.topo, self.workload, self.eff, self.choices, self.seed = topo, workload, eff, choices, seed
        self.families = families
        self.mem_fraction = mem_fraction
        self.layout, self.root = result, root
        self.rng = random.Random(seed)
        self.lay = layout_of(topo)
        self.ev = Evaluator(topo, workload)
        self.pool = _Pool()
        self.climbs: list[dict[str, Any]] = []
        self.moves_of: dict[str, list[str]] = {}
        level_sets = _level_sets(self.lay, eff.max_level_sets)
        self.hier_start = [(ids, [("star", 2)] * len(ids) + [("binomial", 2)]) for ids in level_sets]
        candidates = (standard_schedules(self.lay, workload, small=eff.small)
                      + [hierarchical_schedule(self.lay, ids, shapes) for ids, shapes in self.hier_start]
                      + multirail_schedules(self.lay, small=eff.small) + double_binary_schedules(self.lay)
                      + direct_schedules(self.lay))
        if families is not None:
            candidates = [s for s in candidates if s.family in families]
            if "hierarchical" not in families:
                self.hier_start = []
        fitted = [c for c in (self._fit(s) for s in candidates) if c is not None]
        if result == "heads":
            # the library's all collectives join a search unless it is narrowed (as in ``result``)
            library = [] if families is not None else [Schedule(b.name, b.name, b.kwargs)
                                                        for b in baselines_for(workload, "all")
                                                        if b.name != "ring-attention"]
            fitted += [w for w in map(whole_rows, candidates + library) if w is not None]
        self.candidates = fitted
        self.order: list[Schedule] = []
        self._progress = progress
        self._done = 0
        self._total = 2 * len(fitted) + len(self.hier_start) + eff.improve_starts + 1

    def _fit(self, sched: Schedule) -> Schedule | None:
        return for_result(sched, self.topo.num_ranks, self.layout, self.root)

    def _tick(self, stage: str) -> None:
        self._done += 1
        if self._progress is not None:
            self._progress(min(self._done, self._total), self._total, stage)

    def _best(self) -> float:
        return self.pool.best_t

    def screen(self) -> None:
        """Every candidate at the smallest chunk count, lowest floor first."""
        c0 = self.choices[0]
        floors = []
        for i, sched in enumerate(self.candidates):
            floors.append((self.ev.screen_floor_us(sched, c0), i))
            self._tick("screening")
        self.order = [self.candidates[i] for _, i in sorted(floors)]
        for sched in self.order:
            self.pool.add(sched, c0, self.ev.time_us(sched, c0, self.pool.best_t))

    def sweep(self) -> None:
        """Chunk counts of the best screened candidates (of all of them for small p)."""
        top = self.eff.sweep_top
        for k, sched in enumerate(self.order):
            if top is None or k < top or sched.key in self.pool.top_keys(top):
                c, t = sweep_chunks(self.ev, sched, self.choices, patience=self.eff.patience, cutoff=self._best)
                self.pool.add(sched, c, t)
            self._tick("chunk counts")

    def hierarchies(self) -> None:
        """Coordinate descent over the shape of each level of each hierarchy."""
        for level_ids, shapes in self.hier_start:
            cur = self._fit(hierarchical_schedule(self.lay, level_ids, shapes))
            if cur is None:
                continue
            cur_c, cur_t = self.pool.get(cur.key, (self.choices[0], math.inf))
            for j in range(len(shapes)):
                for alt in HIER_SHAPES[: self.eff.hier_shapes]:
                    if alt == shapes[j]:
                        continue
                    trial = shapes[:j] + [alt] + shapes[j + 1:]
                    sched = self._fit(hierarchical_schedule(self.lay, level_ids, trial))
                    if sched is None:
                        continue
                    t = self.ev.time_us(sched, cur_c, min(cur_t, self.pool.best_t * self.eff.slack))
                    self.pool.add(sched, cur_c, t)
                    if t < cur_t:
                        shapes, cur, cur_t = trial, sched, t
            c, t = sweep_chunks(self.ev, cur, self.choices, patience=self.eff.patience, start=cur_c,
                                cutoff=self._best)
            self.pool.add(cur, c, t)
            self._tick("hierarchies")

    def improve(self) -> None:
        """Hill climbing from the best single trees (within ``improve_slack`` of the best)."""
        eff, ev = self.eff, self.ev
        if self.layout == "heads":
            return  # the climb's moves change one tree; a heads plan is a forest of them
        limit = self.pool.best_t * eff.improve_slack if eff.improve_slack is not None else math.inf
        starts = [x for x in self.pool.ranked() if x[0].algorithm in TREE_ALGORITHMS and x[2] <= limit]
        climb = {"cutoff": math.inf, "chunks": 1}

        def score(tree: tuple[int, ...]) -> float:
            # Trees that cannot beat the climb's current one are not simulated.
            return ev.time_us(self._fit(Schedule("improved", "tree", {"parents": list(tree)})), climb["chunks"],
                              climb["cutoff"])

        def moved(t: float) -> None:
            climb["cutoff"] = t

        for sched, c, t in starts[: eff.improve_starts]:
            par = tuple(ev.plan(sched, c).params["parents"])
            climb.update(cutoff=t, chunks=c)
            res = hill_climb(par, score, self.rng, budget=eff.improve_budget, per_round=eff.per_round,
                             near=self.lay.near, start_score=t, on_move=moved, kicks=eff.kicks)
            self.climbs.append({"from": sched.family, "describe": sched.describe, "start_us": t,
                                "end_us": res.score, "trees_scored": res.evaluated, "moves": len(res.accepted)})
            if res.accepted:
                better = self._fit(Schedule("improved", "tree", {"parents": list(res.par)},
                                            {"from": sched.family, **sched.describe, "moves": len(res.accepted)}))
                c2, t2 = sweep_chunks(ev, better, self.choices, patience=eff.patience, start=c, cutoff=self._best)
                self.pool.add(better, c2, min(t2, res.score) if c2 == c else t2)
                self.moves_of[better.key] = list(res.accepted)
            self._tick("local improvement")

    def exact(self) -> None:
        """Every rooted tree, where p is small enough (pruned against the best so far)."""
        if self.topo.num_ranks > self.eff.exact_ranks or self.layout != "all" or (
                self.families is not None and "exhaustive" not in self.families):
            return
        ex = exhaustive_trees(self.topo, self.workload, chunk_choices=self.choices, evaluator=self.ev,
                              cutoff=self.pool.best_t)
        if ex.parents:
            self.pool.add(Schedule("exhaustive", "tree", {"parents": list(ex.parents)},
                                   {"root": ex.parents.index(-1), "trees": ex.trees}), ex.chunks, ex.predicted_us)

    def result(self, top_k: int) -> SearchResult:
        """Rank the pool, time the baselines, and describe the winning plan."""
        base = baselines(self.topo, self.workload, self.ev, result=self.layout, root=self.root)
        self._tick("baselines")
        # The library's own collectives are executable plans too: where one of them is the
        # fastest schedule on this wiring, the planner says so rather than pick a slower tree.
        # A search narrowed to some families (``families``: none of them a library method) leaves them out.
        for b in baselines_for(self.workload, self.layout, self.root):
            if b.name != "ring-attention" and base.get(b.key) is not None and self.families is None:
                self.pool.add(Schedule(b.name, b.name, b.kwargs), 1, base[b.key])
        ranked = self.pool.ranked()
        if not ranked:
            # Name what narrowed the search: an empty pool is almost always families that build
            # nothing for this layout (multirail for heads, say), not the shape itself.
            only = f" from families {sorted(self.families)}" if self.families is not None else ""
            raise InputError(f"no schedule could be built for {self.topo.num_ranks} ranks and "
                             f"{self.workload.rows} rows with result {self.layout}{only}")
        heads = self.layout == "heads"
        bound = lower_bounds(self.workload, self.topo, result_ranks=(self.root,) if self.layout == "root" else None,
                             shares=heads_shares(self.workload, self.topo.num_ranks) if heads else None)
        bound_us = bound.bound_us

        def ratio(t: float) -> float:
            return t / bound_us if bound_us > 0 else math.inf

        cands: list[Candidate] = []
        shown: set[tuple[str, int, float]] = set()
        left_out: list[dict[str, Any]] = []
        top: tuple[Schedule, int, float, Plan] | None = None
        limit = None  # the pick's rank closest to its memory's limit: that limit
        for s, c, t in ranked:
            # Shapes that coincide on this topology (a "star" of two leaders is also their
            # chain) give the same plan and time: list it once.
            if (s.family, c, t) in shown:
                continue
            shown.add((s.family, c, t))
            plan = self.ev.plan(s, c)
            # what names a schedule left out and rebuilds it (build(builder, ..., **build_params))
            named = {"algorithm": s.family, "params": s.describe, "chunks": c, "predicted_us": t,
                     "builder": s.algorithm, "build_params": dict(s.kwargs)}
            peak = mc = None
            if self.mem_fraction is not None:
                mc = memory_check(plan, self.topo, self.mem_fraction)
                peak = mc.peak_bytes
                if not mc.fits:
                    left_out.append({**named, "peak_bytes": mc.peak_bytes, "reason": "memory", "why": mc.why()})
                    continue
            if self.layout == "all" and (split := bit_groups(plan)):
                # Tensor parallelism goes on from every rank's rows: they must be the same bits,
                # as an all-reduce gives, or the ranks may sample different tokens (or, for a
                # raw sum, run the next layer on different activations).
                chunk, groups = next(iter(split.items()))
                left_out.append({**named, "peak_bytes": peak, "reason": "bits",
                                 "why": f"its ranks would end in {len(groups)} groups whose bits differ "
                                        f"(chunk {chunk})"})
                continue
            if top is None:
                top = (s, c, t, plan)
                limit = None if mc is None else mc.limit_bytes
            cands.append(Candidate(s.family, s.describe, c, t, ratio(t), s.algorithm, peak, dict(s.kwargs)))
            if len(cands) >= max(1, top_k):
                break
        if top is None:
            first = left_out[0]
            if first.get("reason") != "bits":
                more = " or a larger --mem-fraction" if (self.mem_fraction or 1) < 1 else ""
                raise InputError(f"no schedule fits in memory: {first['why']} (the fastest, "
                                 f"{first['algorithm']}); use more ranks{more}")
            raise InputError(f"no schedule searched gives every rank the same bits: {first['why']} (the fastest, "
                             f"{first['algorithm']}); search other families")
        top_sched, top_c, top_t, plan = top
        base_memory = self._baseline_memory(base)
        base_peaks = {key: None if mc is None else mc.peak_bytes for key, mc in base_memory.items()}
        names = {b.key: b.name for b in baselines_for(self.workload, self.layout, self.root)}
        for key, mc in base_memory.items():
            listed = {x["algorithm"] for x in left_out}
            if mc is not None and self.mem_fraction is not None and not mc.fits and names[key] not in listed:
                left_out.append({"algorithm": names[key], "baseline": True, "reason": "memory",
                                 "predicted_us": base[key], "peak_bytes": mc.peak_bytes, "why": mc.why()})
        stats = {
            "seed": self.seed,
            "screened": len(self.candidates),
            "schedules": len(self.pool.items),
            "simulations": self.ev.simulations,
            "pruned": self.ev.pruned,
            "chunk_choices": list(self.choices),
            "levels": [kind for kind, _ in self.lay.levels],
            "climbs": self.climbs,
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
        if top_sched.key in self.moves_of:
            notes["search"]["moves"] = self.moves_of[top_sched.key]
        for reason, key in (("memory", "left_out_for_memory"), ("bits", "left_out_for_bits")):
            # what a reader needs to tell the variants apart (the search's own result, as plan
            # --json, adds each one's builder and build_params); a baseline left out for memory
            # has no parameters or chunks of its own
            out = [{k: x[k] for k in ("algorithm", "params", "chunks", "predicted_us", "why") if k in x}
                   for x in left_out if x["reason"] == reason]
            if out:
                notes["search"][key] = out
        plan = replace(plan, predicted_us=top_t, notes=notes)
        return SearchResult(plan, cands, bound_us, base, stats, base_peaks, left_out, limit)

    def _baseline_memory(self, base: dict[str, float | None]) -> dict[str, MemoryCheck | None]:
        """Per baseline key, its plan's memory check (``memory_check``: its rank closest to
        that rank's limit, as the candidates' and ``compare``'s), against the usable fraction
        (all of it where the search checks none)."""
        from treeattn.search.rings import ring_order

        ring = ring_order(self.topo)[1] if isinstance(self.workload, Workload) else None
        fraction = 1.0 if self.mem_fraction is None else self.mem_fraction
        out: dict[str, MemoryCheck | None] = {}
        for b in baselines_for(self.workload, self.layout, self.root, ring):
            out[b.key] = None if base.get(b.key) is None else memory_check(
                self.ev.plan(Schedule(b.name, b.name, b.kwargs), 1), self.topo, fraction)
        return out
