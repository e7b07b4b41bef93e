"""The Plan IR, its file format, its validator and the builders that make plans."""

from treeattn.plan.builders import ALGORITHMS, AlgorithmSpec, ParamSpec, build, tree_plan
from treeattn.plan.ir import PLAN_VERSION, Op, OpKind, Plan, TopologyRef, chunk_rows, message_bytes
from treeattn.plan.trees import (
    check_parents,
    parents_binomial,
    parents_chain,
    parents_kary,
    parents_of_shape,
    parents_star,
)
from treeattn.plan.validate import ValidationReport, Violation, ViolationKind, check, validate

__all__ = [
    "ALGORITHMS",
    "AlgorithmSpec",
    "ParamSpec",
    "PLAN_VERSION",
    "Op",
    "OpKind",
    "Plan",
    "TopologyRef",
    "ValidationReport",
    "Violation",
    "ViolationKind",
    "build",
    "check",
    "check_parents",
    "chunk_rows",
    "message_bytes",
    "parents_binomial",
    "parents_chain",
    "parents_kary",
    "parents_of_shape",
    "parents_star",
    "tree_plan",
    "validate",
]
