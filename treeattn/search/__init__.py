"""Planners: a topology and a workload in, the fastest schedule (a Plan) out.

``search`` tries every candidate family of docs/design.md section 6 with its best chunk count,
improves the best trees with local moves, and ranks everything by the simulator's
prediction; ``exhaustive_trees`` is the exact answer over all trees for p <= 6 ranks.
"""

from treeattn.search.evaluate import Evaluator, Schedule, chunk_choices
from treeattn.search.exhaustive import EXHAUSTIVE_MAX_RANKS, ExhaustiveResult, exhaustive_trees
from treeattn.search.search import (
    FAMILIES,
    TREE_FAMILIES,
    Candidate,
    Effort,
    SearchResult,
    baselines,
    effort_for,
    search,
)
from treeattn.search.workload_file import load_workload, workload_from_dict

__all__ = [
    "EXHAUSTIVE_MAX_RANKS",
    "FAMILIES",
    "TREE_FAMILIES",
    "Candidate",
    "Effort",
    "Evaluator",
    "ExhaustiveResult",
    "Schedule",
    "SearchResult",
    "baselines",
    "chunk_choices",
    "effort_for",
    "exhaustive_trees",
    "load_workload",
    "search",
    "workload_from_dict",
]
