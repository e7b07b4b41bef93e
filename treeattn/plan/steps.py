"""The step rules of the Plan IR (``treeattn.plan.ir``), in one place.

A rank's steps never decrease; a COLLECTIVE is a step of its own; a step holds at most one
COMPUTE; and no two ops of a step write one chunk when one of them overwrites it (a
RECV_COPY beside another receive of that chunk, or beside a COMPUTE, which merges into
every chunk). The validator reports these as violations, the simulator's reader
(``treeattn.cost.program``) and the executor refuse a plan that breaks them: all three ask
the functions here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from treeattn.plan.ir import Op, OpKind

__all__ = ["StepProblem", "order_problem", "step_problem", "NEVER_BREAK"]

NOT_ALONE = "not-alone"
WRITE_CONFLICT = "write-conflict"

_COLL, _COMPUTE, _MERGE, _COPY = OpKind.COLLECTIVE, OpKind.COMPUTE, OpKind.RECV_MERGE, OpKind.RECV_COPY

NEVER_BREAK = frozenset({OpKind.SEND, OpKind.RECV_MERGE})
"""Kinds that break no rule among themselves: ``step_problem`` finds nothing in a step of only
these, so a reader of many plans (the simulator's) may skip asking it for such steps."""


@dataclass(frozen=True, slots=True)
class StepProblem:
    """One broken step rule: which (a ``ViolationKind`` value), where and what."""

    kind: str
    """``step-order``, ``not-alone`` or ``write-conflict``."""
    index: int
    """The offending op's index in the rank's program."""
    message: str
    """One line, without the location."""


def order_problem(prev: int, step: int) -> str | None:
    """What is wrong when ``step`` follows ``prev`` in a program (None when nothing is)."""
    return None if step >= prev else f"step {step} comes after step {prev}; steps never decrease"


def step_problem(program: Sequence[Op], start: int, stop: int) -> StepProblem | None:
    """The first broken rule among ``program[start:stop]``, the ops of one step, or None."""
    if stop - start < 2:
        return None
    kinds = [program[i].kind for i in range(start, stop)]
    step = program[start].step
    if _COLL in kinds:
        return StepProblem(NOT_ALONE, start + kinds.index(_COLL),
                           f"collective must be a step of its own ({stop - start} ops share step {step})")
    computes = kinds.count(_COMPUTE)
    if computes > 1:
        return StepProblem(NOT_ALONE, start + kinds.index(_COMPUTE, kinds.index(_COMPUTE) + 1),
                           f"step {step} holds more than one compute; a step holds at most one compute")
    if _COPY not in kinds:
        return None
    if computes:
        for i in range(start, stop):
            op = program[i]
            if op.kind is _COPY and op.block is None:
                return StepProblem(WRITE_CONFLICT, i, "a compute of this step merges into every chunk and this "
                                   "receive overwrites one; the result would depend on their order")
    # Receives that write one chunk in one step: fine if all merge, ambiguous if one copies.
    written: set[int | None] = set()
    copied: set[int | None] = set()
    for i in range(start, stop):
        op = program[i]
        if op.block is not None or (op.kind is not _MERGE and op.kind is not _COPY):
            continue
        key = op.chunk
        against = written if op.kind is _COPY else copied
        if key in against or None in against or (key is None and against):
            return StepProblem(WRITE_CONFLICT, i, "another receive of this step writes the same chunk and one of "
                               "them is recv_copy; the result would depend on their order")
        written.add(key)
        if op.kind is _COPY:
            copied.add(key)
    return None
