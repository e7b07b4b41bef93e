"""Every plan family from the builders, executed on 2, 4 and 8 gloo ranks and checked against
the single-process reference. One process group per rank count runs all of its plans in
sequence (``launch`` of a multi-plan ``Job``), since starting 8 ranks costs seconds here."""

from __future__ import annotations

import dataclasses

import pytest

from treeattn.exec.launch import launch
from treeattn.exec.runner import Job, PlanJob, RunOptions
from treeattn.plan.bits import bit_groups
from treeattn.plan.builders import ALGORITHMS, build
from treeattn.plan.ir import Op, OpKind, Plan, TopologyRef
from treeattn.plan.validate import check
from treeattn.workload import RawPayload, Workload

pytestmark = pytest.mark.untimed  # checks results only: scripts/test.sh runs it beside timed tests

REF = TopologyRef("cpu:test", "sha256:test")


def attention(p: int, kv_dtype: str = "fp32", partial: str = "fp32") -> Workload:
    # GQA (8 query heads on 2 KV heads), uneven shards, rank 1 holds none.
    split = tuple([40, 0, *[7 * (i + 1) for i in range(p - 2)]])
    return Workload(batch=2, q_heads=8, kv_heads=2, head_dim=16, split=split, kv_dtype=kv_dtype,
                    partial_dtype=partial)


def family_params(name: str, p: int) -> dict:
    if name == "tree":
        return {"parents": [-1] + [(r - 1) // 3 for r in range(1, p)]}
    if name == "hierarchical":
        return {"groups": [list(range(0, p, 2)), list(range(1, p, 2))]}
    if name == "kary":
        return {"fanout": 3}
    if name in ("star", "chain", "binomial"):
        return {"root": p - 1}
    return {}


def family_plans(p: int, chunk_counts: dict[str, tuple[int, ...]]) -> list[PlanJob]:
    """Every algorithm the builders know, on an attention and a raw payload, chunked and not."""
    jobs = []
    payloads = {"att": attention(p), "raw": RawPayload(nbytes=4 * 24, ranks=p)}
    for name, spec in ALGORITHMS.items():
        for tag, payload in payloads.items():
            if payload.kind not in spec.payloads:
                continue
            for chunks in chunk_counts[tag]:
                plan = build(name, payload, REF, chunks=chunks, **family_params(name, p))
                check(plan)
                jobs.append(PlanJob(f"{name}/{tag}/c{chunks}", plan))
            # The other result layouts, at the last chunk count (heads: chunks per rank).
            for result in spec.results[1:]:
                params = family_params(name, p)
                if result == "heads":
                    params.pop("root", None)
                chunks = 2 if result == "heads" and tag == "att" else chunk_counts[tag][-1]
                plan = build(name, payload, REF, chunks=chunks, result=result, **params)
                check(plan)
                jobs.append(PlanJob(f"{name}/{tag}/{result}", plan))
    if p >= 4:
        root_only = build("binomial", payloads["att"], REF, chunks=2, root=2, result="root")
        jobs.append(PlanJob("binomial/att/root-only", root_only))
        half = attention(p, "bf16", "bf16")
        jobs.append(PlanJob("star/bf16", build("star", half, REF, chunks=3)))
        jobs.append(PlanJob("ring-attention/bf16", build("ring-attention", half, REF)))
        # Partials on a narrower wire keep their lse in fp32 (exec.merge.to_wire); e4m3's are
        # checked against their roundings (runner.tolerance).
        for name in ("binomial", "allgather-merge", "dcp-a2a"):
            jobs.append(PlanJob(f"{name}/bf16-wire", build(name, attention(p, "fp32", "bf16"), REF, chunks=2)))
        jobs.append(PlanJob("star/fp8-wire", build("star", attention(p, "bf16", "fp8"), REF, chunks=2)))
        # fp8 KV (partials in bf16) and fp8 raw buffers: gloo neither gathers nor sums fp8.
        jobs.append(PlanJob("allreduce3/fp8-kv", build("allreduce3", attention(p, "fp8", "bf16"), REF)))
        # Heads kept of an all plan (whole_rows): messages of every row, each rank's own rows its result.
        for name, tag in (("butterfly", "att"), ("direct", "raw"), ("star", "att")):
            whole = build(name, payloads[tag], REF, result="heads", whole_rows=True)
            jobs.append(PlanJob(f"{name}/{tag}/heads-whole", whole))
        raw8 = RawPayload(nbytes=40, ranks=p, dtype="fp8")
        for name in ("allreduce", "allgather-merge", "butterfly"):
            jobs.append(PlanJob(f"{name}/fp8-raw", build(name, raw8, REF, chunks=2)))
    if p == 4:  # heads that do not split evenly: a reduce-scatter pads the segments (2, 2, 1, 1 heads)
        six = Workload(batch=2, q_heads=6, kv_heads=2, head_dim=16, split=attention(p).split)
        for name in ("allreduce2", "dcp-ag-rs", "tree"):
            params = {k: v for k, v in family_params(name, p).items() if k != "root"}
            jobs.append(PlanJob(f"{name}/att/uneven-heads", build(name, six, REF, chunks=2, result="heads", **params)))
        odd = RawPayload(nbytes=4 * 23, ranks=p)
        jobs.append(PlanJob("allreduce/raw/uneven-heads", build("allreduce", odd, REF, chunks=2, result="heads")))
    return jobs


def double_counting_star(p: int) -> Plan:
    """Rank 1 sends its partial twice and the root merges both: the validator would refuse
    it; the executor must run it and the check must call the result wrong."""
    w = Workload(batch=1, q_heads=4, kv_heads=4, head_dim=8, split=tuple([5] * p), kv_dtype="fp32")
    programs = []
    for r in range(p):
        ops = [Op(OpKind.COMPUTE, 0)]
        if r == 0:
            ops += [Op(OpKind.RECV_MERGE, 1, peer=s) for s in range(1, p)] + [Op(OpKind.RECV_MERGE, 2, peer=1)]
        else:
            ops.append(Op(OpKind.SEND, 1, peer=0))
            if r == 1:
                ops.append(Op(OpKind.SEND, 2, peer=0))
        programs.append(tuple(ops))
    return Plan("star", {}, w, REF, 1, tuple(programs), (0,))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_every_family_is_correct(p):
    # 8 ranks on 2 cores are slow: chunked attention plans and unchunked raw ones only.
    chunk_counts = {"att": (1, 3), "raw": (1, 3)} if p < 8 else {"att": (2,), "raw": (1,)}
    jobs = family_plans(p, chunk_counts)
    if p == 4:
        jobs.append(PlanJob("double-counting", double_counting_star(p)))
    # Both orders of the timed runs: 4 ranks deal two rounds out (a third for the first plan
    # and the baselines run on its workload), 2 ranks run each method's block.
    repeats, order = (2, "interleaved") if p == 4 else (1, "blocked")
    if p == 4:
        jobs[0] = dataclasses.replace(jobs[0], repeats=3)
    options = RunOptions(repeats=repeats, warmup=0, check="all", kernel="explicit", baselines=(p != 8), timeout_s=30,
                         order=order)
    result = launch(Job(tuple(jobs), options))
    assert result.backend == "gloo" and result.world == p
    assert result.gpu_peak_bytes == ()  # no GPU: the allocator's peaks are CUDA's
    starts = [m.starts_s for m in result.measurements]
    want = {j.label: j.repeats or repeats for j in jobs}
    assert [len(m.starts_s) for m in result.measurements] == [want[m.label] for m in result.measurements]
    if order == "interleaved":
        # every method's first timed run comes before any method's second, and so on
        assert max(s[0] for s in starts) < min(s[1] for s in starts)
        third = [m.starts_s[2] for m in result.measurements if m.label == jobs[0].label]
        assert len(third) >= 2 and max(s[1] for s in starts) < min(third)  # the plan and its baselines
    else:
        assert all(a[-1] < b[0] for a, b in zip(starts, starts[1:], strict=False))
    by = {(m.label, m.method): m for m in result.measurements}
    labels = [j.label for j in jobs]
    assert [k for k in by if k[1] == "plan"] == [(label, "plan") for label in labels]
    for job in jobs:
        m = by[(job.label, "plan")]
        if job.label == "double-counting":
            assert not m.correct and m.max_rel_err > 1e-3
            continue
        assert m.correct, (job.label, m.max_rel_err)
        plan = job.plan
        # Fp32 plans with the explicit kernel are exact to fp32 rounding, not just within 1e-5.
        # e4m3 partials: a star rounds them twice (to the root, and back), 2**-4 each
        bound = 2 * 2.0**-4 if "fp8-wire" in job.label else 2e-2 if "/fp8" in job.label or "bf16" in job.label else 2e-6
        assert m.max_rel_err <= (0.0 if plan.is_raw else bound)
        assert m.checked_ranks == tuple(sorted(plan.result_ranks))
        assert sorted((t.rank, t.index) for t in m.timeline) == [
            (r, i) for r in range(p) for i in range(len(plan.programs[r]))]
        assert all(0 <= t.post_us <= t.done_us for t in m.timeline)
        # every rank's CPU time for its iteration (its process's threads may use more than one core)
        assert len(m.cpu_us) == p and all(0 <= c <= 4 * max(m.times_us) + 1e5 for c in m.cpu_us)
        assert sum(m.cpu_us) > 0
        # where every rank holds the result, their bits are compared: the same wherever the bit
        # tracker proves it (it may warn where they agree: it tells merges apart by order)
        if plan.result == "all":
            assert m.same_bits is True or bit_groups(plan), job.label
        else:
            assert m.same_bits is None, job.label
    if p != 8:
        methods = {k[1] for k in by}
        assert methods == {"plan", "allreduce3", "allreduce2", "allgather-merge", "dcp-ag-rs", "dcp-a2a",
                           "ring-attention", "allreduce"}
        for (label, method), m in by.items():
            if method != "plan":
                plan = next(j.plan for j in jobs if j.label == label)
                root_only = plan.result.startswith("root") and method in ("allreduce2", "allreduce")
                want = plan.result_ranks if root_only else range(p)
                assert m.correct and m.checked_ranks == tuple(want), (label, method, m.max_rel_err)
                if plan.result == "all":  # the library's all-reduces give every rank the same bits
                    assert m.same_bits is (method != "ring-attention" or p == 2), (label, method)
