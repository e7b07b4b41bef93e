"""Exact search where it is cheap: every rooted tree on p <= 6 ranks at every chunk count.

There are p^(p-1) rooted labeled trees (1,296 at p = 5... 7,776 at p = 6 including the
root choice: 6^5). Each is built as a ``tree`` plan (reduce up, broadcast down) and timed
by the simulator; a tree whose plan's ``Evaluator.floor_us`` already reaches the best time
found is skipped, which keeps the answer exact (the floor never exceeds the simulation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from treeattn.errors import InputError
from treeattn.search.evaluate import Evaluator, Schedule
from treeattn.search.evaluate import chunk_choices as default_chunk_choices
from treeattn.search.trees import all_parent_lists, count_rooted_trees
from treeattn.topology.model import Topology
from treeattn.workload import Payload

__all__ = ["EXHAUSTIVE_MAX_RANKS", "ExhaustiveResult", "exhaustive_trees"]

EXHAUSTIVE_MAX_RANKS = 6


@dataclass(frozen=True, slots=True)
class ExhaustiveResult:
    """The best tree over all rooted trees and chunk counts."""

    parents: tuple[int, ...]
    chunks: int
    predicted_us: float
    trees: int
    """Rooted trees enumerated (p^(p-1))."""
    simulations: int
    pruned: int


def exhaustive_trees(
    topo: Topology,
    workload: Payload,
    *,
    chunk_choices: tuple[int, ...] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    evaluator: Evaluator | None = None,
    cutoff: float = math.inf,
) -> ExhaustiveResult:
    """Time every rooted tree (as a ``tree`` plan: reduce up, broadcast down) at every chunk count.

    Args:
        topo: the topology, at most ``EXHAUSTIVE_MAX_RANKS`` ranks.
        workload: the payload.
        chunk_choices: chunk counts (default ``evaluate.chunk_choices(workload, p)``).
        progress: ``progress(done, total, stage)``.
        evaluator: an ``Evaluator`` of the same topology and payload to share (its cache).
        cutoff: only trees faster than this count (a time already found elsewhere); the
            result has ``predicted_us = inf`` and empty ``parents`` when none is.

    Returns:
        The best (first found on ties, in enumeration order) tree, its chunks and time.

    Examples:
        >>> from treeattn.topology.library import resolve
        >>> from treeattn.workload import RawPayload
        >>> topo = resolve("cpu:ranks=3")
        >>> exhaustive_trees(topo, RawPayload(nbytes=4096, ranks=3), chunk_choices=(1,)).trees
        9
    """
    p = topo.num_ranks
    if p > EXHAUSTIVE_MAX_RANKS:
        raise InputError(f"exhaustive search is for at most {EXHAUSTIVE_MAX_RANKS} ranks "
                         f"({count_rooted_trees(EXHAUSTIVE_MAX_RANKS)} trees); this topology has {p}")
    choices = tuple(sorted(set(chunk_choices or default_chunk_choices(workload, p))))
    ev = evaluator if evaluator is not None else Evaluator(topo, workload)
    sims, pruned = ev.simulations, ev.pruned
    best: tuple[float, tuple[int, ...], int] = (cutoff, (), choices[0])
    total = count_rooted_trees(p)
    for i, par in enumerate(all_parent_lists(p)):
        sched = Schedule("tree", "tree", {"parents": list(par)})
        for c in choices:
            t = ev.time_us(sched, c, best[0])
            if t < best[0]:
                best = (t, par, c)
        if progress is not None:
            progress(i + 1, total, "trees")
    t = best[0] if best[1] else math.inf
    return ExhaustiveResult(best[1], best[2], t, total, ev.simulations - sims, ev.pruned - pruned)
