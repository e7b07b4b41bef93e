"""Why a plan costs what it costs: its trees and the simulated time of each tree level.

For a plan made of trees (``params['parents']``: one parent list, or one per tree of a
forest) the transfers are grouped by the depth of the child end: level d is every message
between depth d and depth d - 1, in the reduce (up) or the broadcast (down) phase. Other
plans (butterfly, ring, collectives) are grouped by step instead. Times come from the
simulator's timeline of the same plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from treeattn.cost.simulate import simulate
from treeattn.plan.ir import Plan
from treeattn.search.trees import depth_of
from treeattn.topology.model import Topology

__all__ = ["LevelCost", "Explanation", "explain", "plan_trees"]


@dataclass(frozen=True, slots=True)
class LevelCost:
    """The transfers of one tree level (or one step) and when they ran."""

    phase: str
    """``compute``, ``reduce``, ``broadcast``, ``step`` (non-tree plans) or ``collective``."""
    level: int
    """Depth of the child end (trees), or the step number."""
    transfers: int
    bytes: int
    start_us: float
    end_us: float
    links: tuple[str, ...]
    """Link kinds the level's routes cross, sorted."""

    @property
    def span_us(self) -> float:
        return self.end_us - self.start_us

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "level": self.level, "transfers": self.transfers, "bytes": self.bytes,
                "start_us": self.start_us, "end_us": self.end_us, "span_us": self.span_us,
                "links": list(self.links)}


@dataclass(frozen=True)
class Explanation:
    """A plan's trees and per-level costs."""

    algorithm: str
    predicted_us: float
    trees: list[tuple[int, ...]]
    """Parent lists (empty for plans that are not trees)."""
    levels: list[LevelCost]

    def to_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "predicted_us": self.predicted_us,
                "trees": [list(t) for t in self.trees], "levels": [lv.to_dict() for lv in self.levels]}


def plan_trees(plan: Plan) -> list[tuple[int, ...]]:
    """The parent lists a plan was built from (``params['parents']``), or [] when it has none."""
    par = plan.params.get("parents")
    if not par:
        return []
    if isinstance(par[0], list | tuple):
        return [tuple(p) for p in par]
    return [tuple(par)]


def explain(plan: Plan, topo: Topology) -> Explanation:
    """Simulate ``plan`` with its timeline and group its transfers by tree level (or step).

    Args:
        plan: the plan.
        topo: the topology it runs on.

    Returns:
        The Explanation, levels in time order.
    """
    res = simulate(plan, topo, timeline=True)
    trees = plan_trees(plan)
    depths: list[list[int]] = [depth_of(t) for t in trees]
    n_trees = len(trees)

    def tree_of(chunk: int | None) -> int:
        return 0 if chunk is None or n_trees <= 1 else chunk % n_trees

    groups: dict[tuple[str, int], dict[str, Any]] = {}
    for t in res.timeline or ():
        if t.kind == "compute":
            key = ("compute", 0)
        elif t.kind == "collective":
            key = ("collective", t.op)
        elif t.kind == "send" or t.bytes == 0:
            continue  # each transfer is counted once, at its receiver; an empty one is not sent
        elif trees:
            d = depths[tree_of(t.chunk)]
            if t.kind == "recv_merge":
                key = ("reduce", d[t.peer])
            else:
                key = ("broadcast", d[t.rank])
        else:
            key = ("step", plan.programs[t.rank][t.op].step)
        g = groups.setdefault(key, {"n": 0, "bytes": 0, "start": t.start_us, "end": t.end_us, "links": set()})
        g["n"] += 1
        g["bytes"] += t.bytes
        g["start"] = min(g["start"], t.start_us)
        g["end"] = max(g["end"], t.end_us)
        if t.peer is not None and t.kind in ("recv_merge", "recv_copy"):
            g["links"].update(_kinds(topo, t.peer, t.rank))
    levels = [LevelCost(phase, level, g["n"] if phase not in ("compute", "collective") else 0, g["bytes"],
                        g["start"], g["end"], tuple(sorted(g["links"])))
              for (phase, level), g in groups.items()]
    levels.sort(key=lambda lv: (lv.start_us, lv.end_us, lv.phase, lv.level))
    return Explanation(plan.algorithm, res.predicted_us, trees, levels)


def _kinds(topo: Topology, src: int, dst: int) -> Sequence[str]:
    return {topo.links[i].kind.value for i in topo.route(src, dst)}
