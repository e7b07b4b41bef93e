"""Predicted times for what a run measures: the simulator on the plan and on the baselines'
plans (``treeattn.plan.baselines.baselines_for`` the plan's result layout, ring attention on
the topology's ring), on the plan's topology, so every measured row has its prediction beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from treeattn.errors import TreeattnError
from treeattn.plan.baselines import Baseline, baselines_for, parse_result
from treeattn.plan.ir import Plan, TopologyRef
from treeattn.topology.model import Topology

__all__ = ["Predictions", "resolve_topology", "predict", "plan_baselines"]


@dataclass(slots=True)
class Predictions:
    """Predicted µs per method (None where the simulator or a builder is unavailable)."""

    topology: str
    """Name of the topology predicted on."""
    us: dict[str, float | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def resolve_topology(plan: Plan, given: str | None) -> tuple[Topology | None, list[str]]:
    """The topology to predict on: ``given`` (name or file), else the plan's own, else
    ``cpu:ranks=p``. Warns when its fingerprint is not the one the plan was made for.

    Args:
        plan: the plan run.
        given: ``--topology`` (preset name or YAML file), or None.

    Returns:
        The topology (None when no topology library is installed) and warnings.
    """
    warnings: list[str] = []
    try:
        from treeattn.topology.library import resolve
    except ImportError:
        return None, ["no topology library (treeattn.topology.library): predictions skipped"]
    want = plan.topology
    if given is not None:
        topo = resolve(given)  # a wrong name or file is the user's error: let it raise
    else:
        # A family member's name lacks its parameters ("cpu", not "cpu:ranks=8"): try the
        # plain name, then the CPU family at the plan's size; prefer the fingerprint match.
        found = []
        for spec in dict.fromkeys((want.name, f"cpu:ranks={plan.ranks}")):
            try:
                found.append(resolve(spec))
            except TreeattnError:
                continue
        exact = [t for t in found if t.fingerprint == want.fingerprint]
        sized = [t for t in found if t.num_ranks == plan.ranks]
        if not (exact or sized):
            return None, [f"cannot resolve the plan's topology {want.name!r}: predictions skipped"]
        topo = (exact or sized)[0]
    if topo.fingerprint != want.fingerprint:
        warnings.append(
            f"plan was made for topology {want.name!r} ({want.fingerprint}) but is predicted on "
            f"{topo.name!r} ({topo.fingerprint}); predictions may not match"
        )
    if topo.num_ranks != plan.ranks:
        warnings.append(f"topology {topo.name!r} has {topo.num_ranks} ranks, the plan {plan.ranks}: "
                        "predictions skipped")
        return None, warnings
    return topo, warnings


def _simulate(plan: Plan, topo: Topology) -> float:
    from treeattn.cost.simulate import simulate

    return float(simulate(plan, topo, timeline=False).predicted_us)


def plan_baselines(plan: Plan, topo: Topology | None) -> tuple[list[Baseline], tuple[int, ...] | None]:
    """The baselines of ``plan``'s payload and result layout, and the ring ring attention runs
    on (``treeattn.search.rings.ring_order`` of ``topo``; None without a topology: rank order)."""
    ring = None
    if topo is not None and topo.num_ranks == plan.ranks and not plan.is_raw:
        from treeattn.search.rings import ring_order

        ring = tuple(ring_order(topo)[1])
    result = plan.result
    layout, root = ("all", None) if result.startswith("ranks:") else parse_result(result, plan.ranks)
    return baselines_for(plan.workload, layout, root, ring), ring


def predict(plan: Plan, topo: Topology | None, baselines: list[Baseline] | tuple[Baseline, ...] = ()) -> Predictions:
    """Simulate ``plan`` and each baseline's builder plan on ``topo``.

    Args:
        plan: the plan run.
        topo: from ``resolve_topology`` (None: every prediction is None).
        baselines: the baselines run beside it (``plan_baselines``).

    Returns:
        ``Predictions`` keyed by method (``plan`` and the baselines' names).
    """
    out = Predictions(topology=topo.name if topo is not None else plan.topology.name)
    out.us = {m: None for m in ("plan", *(b.name for b in baselines))}
    if topo is None:
        return out
    try:
        out.us["plan"] = _simulate(plan, topo)
    except ImportError:
        out.warnings.append("no simulator (treeattn.cost.simulate): predictions skipped")
        return out
    except TreeattnError as exc:
        out.warnings.append(f"cannot simulate the plan: {exc}")
    from treeattn.plan.builders import build

    for b in baselines:
        try:
            out.us[b.name] = _simulate(build(b.name, plan.workload, TopologyRef.of(topo), **b.kwargs), topo)
        except TreeattnError as exc:
            out.warnings.append(f"cannot predict baseline {b.name}: {exc}")
    return out
