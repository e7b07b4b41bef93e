"""Plans built for a floor, kept until the search simulates them.

The screen builds every candidate to read its floor (``Evaluator.screen_floor_us``), then
simulates them lowest floor first; rebuilding and recompiling a plan for its simulation cost
a fifth of a 1,024-rank search at B=128. Keeping every plan costs memory in proportion to
the ranks (about 240 bytes an op, with its compiled Program), so only the lowest floors are
kept, within a budget of ops: those are the ones simulated first, the others are mostly
pruned without being built again.
"""

from __future__ import annotations

from treeattn.plan.ir import Plan

__all__ = ["KEPT_OPS", "KeptPlans"]

KEPT_OPS = 1 << 18
"""The most ops kept in all (about 40 MB measured at 1,024 ranks, B=1): a dozen candidates
at 1,024 ranks, two or three of a 16,384-rank search (its plans have 16 times the ops)."""


class KeptPlans:
    """Plans by (schedule key, chunks) with their floor and op count; a plan leaves when taken."""

    def __init__(self, budget: int = KEPT_OPS) -> None:
        self.budget = budget
        self.ops = 0
        self._kept: dict[tuple[str, int], tuple[float, int, Plan]] = {}

    def keep(self, key: tuple[str, int], floor: float, ops: int, plan: Plan) -> None:
        """Keep ``plan`` if it fits beside the lower floors (the highest floors leave first)."""
        if ops > self.budget or key in self._kept:
            return
        self._kept[key] = (floor, ops, plan)
        self.ops += ops
        while self.ops > self.budget:
            # the highest floor leaves, of equal floors the last kept (max keeps the first it meets)
            self.drop(max(reversed(self._kept), key=lambda k: self._kept[k][0]))

    def take(self, key: tuple[str, int]) -> Plan | None:
        """The kept plan of ``key`` (no longer kept), or None."""
        hit = self._kept.pop(key, None)
        if hit is None:
            return None
        self.ops -= hit[1]
        return hit[2]

    def drop(self, key: tuple[str, int]) -> None:
        self.take(key)
