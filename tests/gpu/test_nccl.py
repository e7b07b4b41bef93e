"""NCCL runs: every plan family and baseline correct on 2, 4 and 8 GPUs (where present), graph
replay equal to eager, a world-size-1 run, and the failure cases: more ranks than GPUs, a plan
past the GPU's free memory, a rank that dies or hangs (every rank stops within the timeout,
naming it), empty shards and fp8."""

from __future__ import annotations

import time

import pytest
import torch

from tests.distributed.test_exec_faults import W3, children
from tests.distributed.test_exec_run import attention, family_plans
from tests.gpu.conftest import gpus, need_gpus
from treeattn.errors import ExecutionError, InputError
from treeattn.exec.interpreter import FAULT_ENV
from treeattn.exec.launch import launch
from treeattn.exec.merger import Merger
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.builders import build
from treeattn.plan.ir import Op, OpKind, Plan, TopologyRef
from treeattn.workload import RawPayload, Workload

REF = TopologyRef("cuda:test", "sha256:test")


def nccl(**kw) -> RunOptions:
    return RunOptions(backend="nccl", repeats=kw.pop("repeats", 2), warmup=kw.pop("warmup", 1),
                      timeout_s=kw.pop("timeout_s", 30.0), **kw)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_every_family_and_baseline_under_nccl(p):
    need_gpus(p)
    jobs = family_plans(p, {"att": (1, 3), "raw": (1,)})  # rank 1 holds no tokens: empty messages
    result = launch(Job(tuple(jobs), nccl(check="all", baselines=True)))
    assert result.backend == "nccl" and result.world == p and result.graphs and result.merge == "fused"
    for m in result.measurements:
        assert m.correct, (m.label, m.method, m.max_rel_err)
        if m.method == "plan":
            assert all(0 <= t.post_us <= t.done_us for t in m.timeline), m.label


@pytest.mark.parametrize("graph", [True, False])
def test_graph_replay_and_eager_both_correct(graph):
    need_gpus(2)
    half = attention(2, "bf16", "bf16")
    jobs = (PlanJob("binomial", build("binomial", half, REF, chunks=2)),
            PlanJob("ring", build("ring-attention", half, REF)))
    result = launch(Job(jobs, nccl(graph=graph, baselines=True, repeats=3)))
    assert result.graphs is graph
    assert all(m.correct for m in result.measurements), [(m.method, m.max_rel_err) for m in result.measurements]


def test_world_size_one_run():
    w = Workload(batch=4, q_heads=32, kv_heads=8, head_dim=128, split=(8192,), kv_dtype="bf16")
    jobs = tuple(PlanJob(name, build(name, w, REF)) for name in ("star", "allreduce2", "allgather-merge"))
    result = launch(Job(jobs, nccl(baselines=True)))
    assert result.world == 1 and result.graphs
    assert all(m.correct for m in result.measurements)


def test_merger_graph_replay_equals_eager(nccl_world_of_one):
    w = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=64, split=(100,), kv_dtype="bf16", partial_dtype="bf16")
    plan = build("allreduce2", w, REF)  # NCCL collectives and merges inside the graph
    eager, graphed = Merger(plan, graph=False), Merger(plan)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(3):
        o = torch.randn(2, 8, 64, device="cuda", generator=gen)
        lse = torch.randn(2, 8, device="cuda", generator=gen) * 4
        want, got = eager(o, lse), graphed(o, lse)
        assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_more_ranks_than_gpus_exits_2_before_launch():
    p = gpus() + 1
    w = Workload(batch=1, q_heads=4, kv_heads=2, head_dim=8, split=tuple([4] * p), kv_dtype="fp32")
    before = set(children())
    with pytest.raises(InputError, match=f"^{p} ranks, {gpus()} GPUs? on this node") as info:
        launch(Job((PlanJob("star", build("star", w, REF)),), nccl()))
    assert info.value.exit_code == 2 and set(children()) <= before


def test_a_plan_past_the_gpus_free_memory_exits_2_before_allocating():
    # One layer of bf16 KV, 8 heads of 128: 4 KiB a token; one token more than the GPU has free.
    tokens = torch.cuda.mem_get_info(0)[0] // 4096 + 1
    w = Workload(batch=1, q_heads=32, kv_heads=8, head_dim=128, split=(tokens,), kv_dtype="bf16")
    with pytest.raises(InputError, match=r"^rank 0 failed: star: rank 0 holds at least .* on GPU 0 \(") as info:
        launch(Job((PlanJob("star", build("star", w, REF)),), nccl()))
    assert info.value.exit_code == 2 and "available; free that memory" in str(info.value)


def test_a_plan_whose_ranks_would_issue_communicators_in_a_cycle_exits_2_before_starting():
    # tests/unit/test_exec_nccl_order.py's straddling plan: valid, and run by gloo, but its
    # ranks would use their pair communicators in a cycle on NCCL
    need_gpus(3)
    raw = RawPayload(nbytes=64, ranks=3)
    send, copy = OpKind.SEND, OpKind.RECV_COPY
    plan = Plan(algorithm="straddle", params={}, workload=raw, topology=REF, chunks=1,
                programs=[(Op(send, 0, peer=1), Op(send, 0, peer=2)), (Op(copy, 0, peer=2), Op(copy, 1, peer=0)),
                          (Op(copy, 0, peer=0), Op(send, 1, peer=1))],
                result_ranks=(0, 1, 2), contributors=(0,))
    with pytest.raises(InputError, match=r"on NCCL its ranks would issue operations on their communicators in a "
                                         r"cycle \(ranks 0-1 -> ranks 0-2 -> ranks 1-2 -> ranks 0-1") as info:
        launch(Job((PlanJob("straddle", plan),), nccl()))
    assert info.value.exit_code == 2


def test_rank_that_dies_is_named_within_the_timeout(monkeypatch):
    need_gpus(3)
    monkeypatch.setenv(FAULT_ENV, "2:9:exit")
    before = set(children())
    t = time.monotonic()
    with pytest.raises(ExecutionError) as info:
        launch(Job((PlanJob("p", build("binomial", W3, REF, chunks=2)),), nccl(repeats=3, timeout_s=3.0)))
    assert str(info.value).startswith("rank 2 died with exit code 17"), str(info.value)
    assert info.value.exit_code == 1 and set(children()) <= before
    assert time.monotonic() - t < 120  # start-up and compile included; the wait itself is 3 s


def test_hung_peer_is_named_within_the_timeout():
    need_gpus(2)
    w = Workload(batch=1, q_heads=2, kv_heads=2, head_dim=8, split=(3, 3), kv_dtype="fp32")
    programs = ((Op(OpKind.COMPUTE, 0), Op(OpKind.RECV_MERGE, 1, peer=1)), (Op(OpKind.COMPUTE, 0),))
    plan = Plan("broken", {}, w, REF, 1, programs, (0,))
    before = set(children())
    with pytest.raises(ExecutionError) as info:
        launch(Job((PlanJob("p", plan),), nccl(timeout_s=2.0, graph=False)))
    text = str(info.value)
    assert text.startswith("rank 0 failed: rank 0: recv_merge chunk None with rank 1 (step 1) failed: Timed out"), text
    assert set(children()) <= before


def test_fp8_and_empty_shards_travel_over_nccl():
    need_gpus(2)
    w8 = Workload(batch=2, q_heads=8, kv_heads=2, head_dim=16, split=(40, 0), kv_dtype="fp8", partial_dtype="bf16")
    jobs = (PlanJob("ring/fp8", build("ring-attention", w8, REF)), PlanJob("star/fp8", build("star", w8, REF)))
    result = launch(Job(jobs, nccl(baselines=True)))
    assert all(m.correct for m in result.measurements), [(m.method, m.max_rel_err) for m in result.measurements]
