"""Shared helpers of the plan tests (payloads, per-algorithm parameters, plan surgery); no tests here."""

from __future__ import annotations

from dataclasses import replace

from treeattn.plan import ALGORITHMS, Op, OpKind, Plan, TopologyRef, build, parents_kary
from treeattn.workload import RawPayload, Workload

REF = TopologyRef("test-flat", "sha256:0123456789abcdef")
RANKS = (1, 2, 3, 4, 5, 7, 8, 16)
CHUNKS = (1, 3, 4)


def attention(p: int) -> Workload:
    """An attention payload with 64 rows (enough for a 16-rank ring with 4 chunks a segment) and a head
    for each of 16 ranks."""
    split = tuple(64 * (i + 1) for i in range(p))
    return Workload(batch=4, q_heads=16, kv_heads=2, head_dim=16, split=split)


def raw(p: int) -> RawPayload:
    return RawPayload(nbytes=4 * 64, ranks=p)


def extra_params(name: str, p: int) -> dict:
    """Parameters an algorithm needs (or that exercise its options) at p ranks."""
    if name == "tree":
        return {"parents": parents_kary(p, fanout=3)}
    if name == "hierarchical":
        return {"group_size": 3, "intra": "chain", "inter": "binomial"}
    if name == "multirail":
        return {"trees": min(3, p)}
    return {}


def every_plan(p: int, chunks: int) -> list[Plan]:
    """Every algorithm on every payload kind it takes, with each result mode it supports."""
    plans = []
    for name, spec in ALGORITHMS.items():
        for payload in (attention(p), raw(p)):
            if payload.kind not in spec.payloads:
                continue
            for result in spec.results:
                plans.append(build(name, payload, REF, chunks=chunks, result=result, **extra_params(name, p)))
    return plans


def with_program(plan: Plan, rank: int, ops: list[Op]) -> Plan:
    programs = list(plan.programs)
    programs[rank] = tuple(ops)
    return replace(plan, programs=tuple(programs))


def op_indices(plan: Plan, kind: OpKind) -> list[tuple[int, int]]:
    return [(r, i) for r, prog in enumerate(plan.programs) for i, op in enumerate(prog) if op.kind is kind]


def split_step(ops: list[Op], first: int, later: int) -> list[Op]:
    """Move op ``later`` into a step of its own right after the step of op ``first``.

    Steps are doubled so that there is room; op order is otherwise kept."""
    moved = [replace(op, step=2 * op.step) for op in ops]
    moved[later] = replace(ops[later], step=2 * ops[first].step + 1)
    order = sorted(range(len(moved)), key=lambda i: (moved[i].step, i))
    return [moved[i] for i in order]
