"""What a case measures: the best plan of every candidate family, the planner's pick, the baselines.

Each family's plan is what ``search`` returns when restricted to that family (chunk count
swept, trees locally improved), so it is the family's best as the planner sees it. Families
that give the same schedule (a star and a 1-level k-ary tree on 4 ranks, say) are measured
once, under one method named after all of them (``star+kary``). The pick is the plan of the
unrestricted search; when it equals a family's plan that method carries ``is_pick``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from treeattn.errors import InputError
from treeattn.plan.ir import Plan
from treeattn.search.search import FAMILIES, search
from treeattn.topology.model import Topology
from treeattn.workload import Workload

__all__ = ["MethodPlan", "CasePlans", "case_plans"]


@dataclass(frozen=True)
class MethodPlan:
    """One plan to measure."""

    method: str
    """Family name(s) joined by ``+``, or the pick's family when no family search found it."""
    plan: Plan
    is_pick: bool


@dataclass(frozen=True)
class CasePlans:
    """The plans of one case, the pick's prediction and what was skipped."""

    methods: tuple[MethodPlan, ...]
    pick_predicted_us: float
    skipped: tuple[str, ...]
    """Families with no plan for this case, with the reason."""

    @property
    def pick(self) -> MethodPlan:
        return next(m for m in self.methods if m.is_pick)


def _key(plan: Plan) -> tuple:
    return plan.chunks, plan.programs


def case_plans(topo: Topology, workload: Workload, *, families: Collection[str] | None = None,
               seed: int = 0, result: str = "all") -> CasePlans:
    """The best plan of every candidate family on ``topo`` and the planner's overall pick.

    Args:
        topo: the topology to plan on (calibrated, when calibration ran).
        workload: the case's workload.
        families: the families to measure (default ``FAMILIES``); the pick always comes from
            the search over all of them.
        seed: the search's seed.
        result: the result layout planned (``all`` or ``heads``).

    Returns:
        The methods in ``FAMILIES`` order (duplicates merged), the pick marked.

    Raises:
        InputError: an unknown family, or no family has a plan.
    """
    wanted = tuple(FAMILIES if families is None else families)
    unknown = sorted(set(wanted) - set(FAMILIES))
    if unknown:
        raise InputError(f"unknown candidate families {unknown}; choose from {', '.join(FAMILIES)}")
    best = search(topo, workload, seed=seed, top_k=1, result=result).best
    groups: dict[tuple, list[str]] = {}
    plans: dict[tuple, Plan] = {}
    skipped = []
    for fam in wanted:
        try:
            plan = search(topo, workload, seed=seed, top_k=1, families=[fam], result=result).best
        except InputError as exc:
            skipped.append(f"{fam}: {exc}")
            continue
        key = _key(plan)
        groups.setdefault(key, []).append(fam)
        plans.setdefault(key, plan)
    pick_key = _key(best)
    methods = [MethodPlan("+".join(fams), plans[key], key == pick_key) for key, fams in groups.items()]
    if pick_key not in groups:
        name = str(best.notes.get("search", {}).get("family", best.algorithm))
        taken = {m.method for m in methods}
        methods.append(MethodPlan(name if name not in taken else f"{name}-pick", best, True))
    if not methods:
        raise InputError(f"no candidate family has a plan for {workload.ranks} ranks on {topo.name!r}")
    return CasePlans(tuple(methods), float(best.predicted_us), tuple(skipped))
