"""The fused merge kernels (what CUDA runs) through the executor, every kind of COLLECTIVE and the
baselines, on gloo ranks (compiled for the CPU by the same torch.compile), and a world of one
rank. The GPU's own run of the same paths is tests/gpu."""

from __future__ import annotations

import dataclasses

import pytest

from tests.distributed.test_exec_run import attention
from treeattn.exec.launch import launch
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import build
from treeattn.plan.ir import Op, OpKind, Plan, TopologyRef
from treeattn.workload import Workload

pytestmark = pytest.mark.untimed  # checks results only: scripts/test.sh runs it beside timed tests

REF = TopologyRef("cpu:test", "sha256:test")


def test_fused_merges_through_plans_collectives_and_baselines(monkeypatch):
    monkeypatch.setenv("TREEATTN_MERGE", "fused")
    w = attention(2, "bf16", "bf16")  # rank 1 holds no tokens
    plans = [("binomial", 2, {}), ("allreduce3", 1, {}), ("allreduce2", 2, {"result": "heads"}), ("dcp-ag-rs", 2, {}),
             ("allgather-merge", 1, {})]
    jobs = tuple(PlanJob(name, build(name, w, REF, chunks=c, **kw)) for name, c, kw in plans)
    jobs += (PlanJob("query gathered", query_gathered(build("dcp-ag-rs", w, REF, chunks=2))),)
    result = launch(Job(jobs, RunOptions(repeats=2, warmup=1, baselines=True, timeout_s=60, check="all")))
    assert result.merge == "fused" and not result.graphs
    methods = {m.method for m in result.measurements}
    assert {"allreduce3", "allreduce2", "allgather-merge", "ring-attention", "dcp-ag-rs", "dcp-a2a"} <= methods
    for m in result.measurements:
        assert m.correct, (m.label, m.method, m.max_rel_err)


def query_gathered(plan: Plan) -> Plan:
    """``plan`` with every rank starting from its own query heads (what tensor parallelism
    gives it, and vLLM's decode context parallel starts from): the IR's ``allgather copy q``
    first, every op a step later."""
    progs = tuple((Op(OpKind.COLLECTIVE, 0, coll="allgather", reduce="copy", part="q"),
                   *(dataclasses.replace(op, step=op.step + 1) for op in prog)) for prog in plan.programs)
    return dataclasses.replace(plan, programs=progs, predicted_us=None)


def test_a_world_of_one_rank():
    w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=16, split=(50,), kv_dtype="fp32")
    jobs = (PlanJob("star", build("star", w, REF)), PlanJob("allreduce2", build("allreduce2", w, REF)))
    result = launch(Job(jobs, RunOptions(repeats=2, warmup=0, baselines=True)))
    assert result.world == 1 and result.merge == "eager"
    assert all(m.correct and m.max_rel_err < 1e-6 for m in result.measurements)
    assert [m.method for m in result.measurements][:2] == ["plan", "allreduce3"]
