"""The compact form of a plan: its builder and parameters instead of its ops.

Every builder records in ``Plan.params`` what it used (orders, parent lists, groups,
fan-outs, chunks, result); ``build_args`` reads the builder's keyword arguments back out of
them and ``expand`` runs the builder again. A plan file in the compact form
(``programs: built``, docs/plan-format.md) holds the header only and is expanded into the
same ``Plan`` when read, so the validator, the simulator and the executor see one IR. A plan
is written compact only when ``compact_args`` has rebuilt it and found exactly its programs.
"""

from __future__ import annotations

from typing import Any

from treeattn.errors import PlanFormatError, TreeattnError
from treeattn.plan.builders import ALGORITHMS, build
from treeattn.plan.ir import Plan, TopologyRef
from treeattn.workload import Payload

__all__ = ["BUILT", "COMPACT_ABOVE_OPS", "build_args", "compact_args", "expand"]

BUILT = "built"
"""The value of ``programs`` in a compact plan file."""

COMPACT_ABOVE_OPS = 16384
"""Plans with more ops than this are written compact by default (about 1 MB of YAML); smaller
ones list their ops, which is what a reader wants to see."""


def build_args(algorithm: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The keyword arguments of ``build(algorithm, ...)`` recorded in ``params`` (None for an
    algorithm no builder has)."""
    spec = ALGORITHMS.get(algorithm)
    if spec is None:
        return None
    names = {p.name for p in spec.params} | {"result", "whole_rows"}
    args = {k: v for k, v in params.items() if k in names}
    # A tree given by its shape also records the parent lists it made; the shape is the argument.
    if "shape" in args:
        args.pop("parents", None)
    elif algorithm == "multirail":
        args.pop("roots", None)
    return args


def expand(algorithm: str, params: dict[str, Any], workload: Payload, topology: TopologyRef) -> Plan:
    """The plan ``algorithm``'s builder makes from ``params``.

    Raises:
        PlanFormatError: the builder refuses the parameters, or what it makes records other
            parameters than ``params`` (they do not describe its plan).
    """
    args = build_args(algorithm, params)
    if args is None:
        raise PlanFormatError(f"programs: {BUILT} needs a builder's algorithm; no builder is named {algorithm!r}")
    try:
        plan = build(algorithm, workload, topology, **args)
    except (TreeattnError, TypeError, ValueError) as exc:
        raise PlanFormatError(f"programs: {BUILT}, but the {algorithm} builder refuses params: {exc}") from None
    if _typed(plan.params) != _typed(params):
        keys = sorted(k for k in set(plan.params) | set(params) if _typed(plan.params.get(k)) != _typed(params.get(k)))
        raise PlanFormatError(f"programs: {BUILT}, but params.{keys[0]} is not what the {algorithm} builder records "
                              "for these parameters: params do not describe a built plan")
    return plan


def _typed(value: Any) -> Any:  # noqa: ANN401 - any params value
    """``value`` with each scalar's type beside it: ``root: 0.0`` or ``false`` is no ``0``, as
    Python's ``==`` would have it."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_typed(v) for v in value]
    return type(value).__name__, value


def compact_args(plan: Plan) -> dict[str, Any] | None:
    """``build_args`` of ``plan`` when its builder, run again on them, makes exactly ``plan``
    (programs, chunks, params, result ranks, contributors, layout); else None."""
    try:
        again = expand(plan.algorithm, plan.params, plan.workload, plan.topology)
    except PlanFormatError:
        return None
    same = (again.programs == plan.programs and again.chunks == plan.chunks
            and again.result_ranks == plan.result_ranks and again.contributors == plan.contributors
            and again.layout == plan.layout and again.workload == plan.workload)
    return build_args(plan.algorithm, plan.params) if same else None
